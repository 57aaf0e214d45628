"""python -m bench.salt_side_by_side [options]: see bench/scenarios/salt_side_by_side.py."""

from bench.runner import run
from bench.scenarios.salt_side_by_side import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
