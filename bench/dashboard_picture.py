"""python -m bench.dashboard_picture [options]: see bench/scenarios/dashboard_picture.py."""

from bench.runner import run
from bench.scenarios.dashboard_picture import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
