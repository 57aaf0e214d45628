"""python -m bench.database_restart [options]: see bench/scenarios/database_restart.py."""

from bench.runner import run
from bench.scenarios.database_restart import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
