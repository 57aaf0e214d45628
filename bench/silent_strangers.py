"""python -m bench.silent_strangers [options]: see bench/scenarios/silent_strangers.py."""

from bench.runner import run
from bench.scenarios.silent_strangers import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
