"""python -m bench.sessions [options]: see bench/scenarios/sessions.py."""

from bench.runner import run
from bench.scenarios.sessions import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
