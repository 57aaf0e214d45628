"""python -m bench.web_live [options]: see bench/scenarios/web_live.py."""

from bench.runner import run
from bench.scenarios.web_live import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
