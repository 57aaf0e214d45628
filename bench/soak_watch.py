"""The soak's watchers (issue 44): every server exit recorded (planned by a fault or not;
one no fault meant is started again so that the soak goes on), every Temporal host (the
server's child) seen gone while its server ran on (the checker tells whether a fault
explains it: bench/soak_check.py `unplanned_exit`), and every SAMPLE_EVERY
seconds the servers', their Temporal hosts' and the agents' RSS and the cluster's
database connections (the soak's own sessions left out).
"""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import trio

from bench.measure import rss_mib
from bench.runner import log
from bench.soak_model import Exit, HostExit, Sample
from bench.soak_state import APP_NAME, SERVER_START_TIMEOUT, Soak
from oz0.temporal.host import HOST_ENV

SAMPLE_EVERY = 5.0
# The Temporal host's program (oz0/temporal/host.py host_binary), by its name.
HOST = Path(os.environ.get(HOST_ENV) or "oz0-temporal-host").name
EXIT_POLL = 0.5


async def watch_exits(soak: Soak) -> None:
    """A server that exits when no fault meant it to: recorded, and started again so
    that the soak goes on."""
    while True:
        await trio.sleep(EXIT_POLL)
        watch_hosts(soak)
        for address, server in soak.servers.items():
            process = server.process
            if address in soak.planned_down or process is None or process.poll() is None:
                continue
            log(f"server {address} exited (code {process.returncode}) unplanned")
            soak.exits.append(Exit(f"server {address}", soak.minute(), process.returncode, False))
            soak.planned_down.add(address)
            try:
                await trio.to_thread.run_sync(
                    lambda s=server: s.start(timeout=SERVER_START_TIMEOUT)  # type: ignore[misc]
                )
            finally:
                soak.planned_down.discard(address)


def watch_hosts(soak: Soak) -> None:
    """Each running server's Temporal hosts (its children) now; one seen before and gone
    while its server runs on is recorded (a server that exits, or is stopped, takes its
    host with it: its own exit covers that, and its next host is a new start)."""
    for address, server in soak.servers.items():
        process = server.process
        if process is None or process.poll() is not None or address in soak.planned_down:
            soak.hosts.pop(address, None)
            continue
        now = {pid for pid in server.children() if is_host(pid)}
        for pid in soak.hosts.get(address, set()) - now:
            log(f"the Temporal host of {address} (pid {pid}) exited")
            soak.host_exits.append(HostExit(address, pid, soak.minute()))
        soak.hosts[address] = now


def is_host(pid: int) -> bool:
    """Whether PID is a Temporal host serving (not its `setup-schema` run at a start,
    which ends when done)."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return Path(argv[0].decode(errors="replace")).name == HOST and b"setup-schema" not in argv


async def sample(soak: Soak) -> None:
    while True:
        minute = soak.minute()
        for address, server in soak.servers.items():
            if server.process is not None and server.process.poll() is None:
                soak.rss.append(Sample(f"server {address}", server.pid, minute,
                                       rss_mib(server.pid)))  # fmt: skip
                for pid in server.children():
                    soak.rss.append(Sample(f"host {address}", pid, minute, rss_mib(pid)))
        for agent in soak.fleet.agents:
            if agent.process.running():
                pid = agent.process.process.pid  # type: ignore[union-attr]
                soak.rss.append(Sample(f"agent {agent.index}", pid, minute, rss_mib(pid)))
        counts = await trio.to_thread.run_sync(count_connections, soak)
        if counts is not None:
            total = sum(counts.values())
            if total > max((n for _, n in soak.connections), default=-1):
                soak.connections_at_peak = counts
            soak.connections.append((minute, total))
        await trio.sleep(SAMPLE_EVERY)


def count_connections(soak: Soak) -> dict[str, int] | None:
    """The cluster's database sessions, by database (the soak's own left out)."""
    names = list(soak.bench.url.names.all())
    try:
        with soak.store() as conn:
            rows = conn.execute(
                "SELECT datname, count(*) FROM pg_stat_activity WHERE datname = ANY(%s)"
                " AND backend_type = 'client backend' AND application_name <> %s"
                " GROUP BY datname",
                (names, APP_NAME),
            ).fetchall()
    except psycopg.Error:
        return None
    return {str(name): int(count) for name, count in rows}
