"""python -m bench.edge_load [options]: see bench/scenarios/edge_load.py."""

from bench.runner import run
from bench.scenarios.edge_load import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
