"""python -m bench.temporal_host [options]: see bench/scenarios/temporal_host.py."""

from bench.runner import run
from bench.scenarios.temporal_host import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
