"""python -m bench.fanout_scale [options]: see bench/scenarios/fanout_scale.py."""

from bench.runner import run
from bench.scenarios.fanout_scale import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
