"""python -m bench.operator_removal [options]: see bench/scenarios/operator_removal.py."""

from bench.runner import run
from bench.scenarios.operator_removal import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
