"""python -m bench.agent_file [options]: see bench/scenarios/agent_file.py."""

from bench.runner import run
from bench.scenarios.agent_file import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
