"""Temporal host start time to serving, and idle memory, per server.

    python -m bench.temporal_host [--servers N] [--idle SECONDS]

The runner (bench/runner.py) starts a fresh test cluster and N real servers on 127.0.0.31,
.32, ..., one after the other; for each: time from `server start` to "is up" (which waits
for Temporal to serve, the runner's `server_start_s`), the host's own start-to-serving
time and the CPU it and the server process had spent by then (its start's cost), and after
an idle period the RSS of the host and of the server process. `python` here is the
interpreter the servers run on: run it from a venv of another to compare.
"""

from __future__ import annotations

import argparse
import re
import time

from bench.measure import cpu_seconds, rss_mib
from bench.runner import Bench, Scenario


def measure(bench: Bench) -> None:
    results = []
    for address, server in bench.servers.items():
        match = re.search(r"Temporal serving on \S+ after (\d+) ms", server.stderr())
        (host,) = server.children()
        results.append(
            {
                "server": address,
                "start_to_up_s": bench.out["server_start_s"][address],
                "host_start_to_serving_ms": int(match[1]) if match else None,
                # Read once every server is up: a start's cost, plus the seconds of idle
                # since (about 3 % of a core for the host, 2 % for the server).
                "host_cpu_at_up_s": round(cpu_seconds(host), 2),
                # The server's own (Python): its imports most of it, so it depends on the
                # interpreter's build (docs/run-a-cluster.md).
                "server_cpu_at_up_s": round(cpu_seconds(server.pid), 2),
            }
        )
    time.sleep(bench.args.idle)
    for server, result in zip(bench.servers.values(), results, strict=True):
        (host,) = server.children()
        result["host_idle_rss_mib"] = round(rss_mib(host), 1)
        result["server_idle_rss_mib"] = round(rss_mib(server.pid), 1)
    bench.out["idle_s"] = bench.args.idle
    bench.out["results"] = results


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--idle", type=float, default=30.0)


SCENARIO = Scenario(
    "temporal_host",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda args: [f"127.0.0.{31 + i}" for i in range(args.servers)],
)
