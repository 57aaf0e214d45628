"""python -m bench.listings [options]: see bench/scenarios/listings.py."""

from bench.runner import run
from bench.scenarios.listings import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
