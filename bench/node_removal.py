"""python -m bench.node_removal [options]: see bench/scenarios/node_removal.py."""

from bench.runner import run
from bench.scenarios.node_removal import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
