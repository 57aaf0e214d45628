"""python -m bench.soak [options]: see bench/scenarios/soak.py."""

from bench.runner import run
from bench.scenarios.soak import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
