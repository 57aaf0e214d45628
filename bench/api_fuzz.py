"""python -m bench.api_fuzz [options]: see bench/scenarios/api_fuzz.py."""

from bench.runner import run
from bench.scenarios.api_fuzz import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
