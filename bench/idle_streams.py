"""python -m bench.idle_streams [options]: see bench/scenarios/idle_streams.py."""

from bench.runner import run
from bench.scenarios.idle_streams import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
