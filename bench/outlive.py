"""python -m bench.outlive [options]: see bench/scenarios/outlive.py."""

from bench.runner import run
from bench.scenarios.outlive import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
