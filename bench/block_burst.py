"""python -m bench.block_burst [options]: see bench/scenarios/block_burst.py."""

from bench.runner import run
from bench.scenarios.block_burst import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
