"""python -m bench.jobs [options]: see bench/scenarios/jobs.py."""

from bench.runner import run
from bench.scenarios.jobs import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
