"""Temporal host start time to serving, and idle memory, per server.

    python -m bench.temporal_host [--servers N] [--idle SECONDS]

Starts a fresh test cluster (the suite's PostgreSQL, see fixtures/postgres.py) and N real
servers on 127.0.0.31, .32, ...; for each: time from `server start` to "is up" (which
waits for Temporal to serve), the host's own start-to-serving time, and after an idle
period the RSS of the host and of the server process.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import tempfile
import time
from pathlib import Path

from fixtures.cluster import ServerProcess, initialise
from fixtures.postgres import fresh_database_url


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--idle", type=float, default=30.0)
    args = parser.parse_args()

    results = []
    with tempfile.TemporaryDirectory() as tmp, fresh_database_url() as url:
        root = Path(tmp)
        files = initialise(root, url, "bench")
        servers = []
        try:
            for i in range(args.servers):
                address = f"127.0.0.{31 + i}"
                server = ServerProcess.for_cluster(files, address, workdir=root / address)
                began = time.monotonic()
                server.start(timeout=180)
                up = time.monotonic() - began
                match = re.search(r"Temporal serving on \S+ after (\d+) ms", server.stderr())
                servers.append(server)
                results.append(
                    {
                        "server": address,
                        "start_to_up_s": round(up, 2),
                        "host_start_to_serving_ms": int(match[1]) if match else None,
                    }
                )
            time.sleep(args.idle)
            for server, result in zip(servers, results, strict=True):
                (host,) = server.children()
                result["host_idle_rss_mib"] = round(rss_mib(host), 1)
                result["server_idle_rss_mib"] = round(rss_mib(server.pid), 1)
        finally:
            for server in servers:
                server.kill()
    print(
        json.dumps(
            {"machine": platform.platform(), "idle_s": args.idle, "servers": results}, indent=2
        )
    )


if __name__ == "__main__":
    main()
