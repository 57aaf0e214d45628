"""python -m bench.fleet_scale [options]: see bench/scenarios/fleet_scale.py."""

from bench.runner import run
from bench.scenarios.fleet_scale import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
