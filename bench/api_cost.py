"""python -m bench.api_cost [options]: see bench/scenarios/api_cost.py."""

from bench.runner import run
from bench.scenarios.api_cost import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
