"""python -m bench SCENARIO [options]: see bench/runner.py."""

from bench.runner import main

main()
