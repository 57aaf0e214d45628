"""How fast the command line answers (issue 27): `orchestrator-zero --help`, and `node list`
against a server that runs (goals on a quiet machine: 150 ms and 300 ms of wall time).

    python -m bench.cli_start [--runs N] [--context PATH]

Runs each command once to warm the page cache, then N times, and prints one JSON object:
per command the wall time (min and median, ms), the CPU time of its process (median, ms:
steadier than wall time on a busy machine) and the load average before and after. With
--context (a context.json), also `node list` against the context's servers, for example a
dev server: `orchestrator-zero server start --dev --data-dir DIR --advertise 127.0.0.230`,
then `--context DIR/context/context.json`. Self-contained: it starts nothing itself.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

# The venv's own command, as a user types it (its console script).
COMMAND = str(Path(sys.executable).with_name("orchestrator-zero"))


def _measure(args: list[str], runs: int, env: dict[str, str]) -> dict[str, Any]:
    walls: list[float] = []
    cpus: list[float] = []
    load_before = os.getloadavg()[0]
    for i in range(runs + 1):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run([COMMAND, *args], env=env, stdout=subprocess.DEVNULL, check=True)
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if i == 0:
            continue  # the warm-up run
        walls.append(wall * 1000)
        cpus.append((after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000)
    return {
        "command": " ".join(["orchestrator-zero", *args]),
        "runs": runs,
        "wall_ms_min": round(min(walls), 1),
        "wall_ms_median": round(statistics.median(walls), 1),
        "cpu_ms_median": round(statistics.median(cpus), 1),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--context", type=Path, help="context.json for `node list`")
    options = parser.parse_args()
    env = dict(os.environ)
    results = [_measure(["--help"], options.runs, env)]
    if options.context is not None:
        env["OZ0_CONTEXT"] = str(options.context.resolve())
        results.append(_measure(["node", "list"], options.runs, env))
    print(json.dumps({"benchmark": "cli_start", "results": results}, indent=2))


if __name__ == "__main__":
    main()
