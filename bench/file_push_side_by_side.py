"""python -m bench.file_push_side_by_side: see bench/scenarios/file_push_side_by_side.py."""

from bench.runner import run
from bench.scenarios.file_push_side_by_side import SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
