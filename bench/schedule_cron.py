"""python -m bench.schedule_cron [options]: see bench/scenarios/schedule_cron.py."""

import sys

from bench.runner import run
from bench.scenarios.schedule_cron import DOCUMENTS, SCENARIO

if __name__ == "__main__":
    run(SCENARIO)
    # The runner prints the document either way; a missing or doubled run must also fail
    # the command, for whoever runs it from a script.
    if not DOCUMENTS or "failed" in DOCUMENTS[-1]:
        sys.exit(1)
