"""What the benchmarks measure, in one place: CPU and RSS of processes, percentiles, this
process's loop lag and garbage collections, what the database says about nodes and
servers, and what the servers logged. No benchmark measures these its own way."""

from __future__ import annotations

import datetime as dt
import math
import os
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio

from fixtures.cluster import ClusterFiles, ServerProcess
from fixtures.edge_client import HEARTBEAT, MISSED_HEARTBEATS

CLK_TCK = os.sysconf("SC_CLK_TCK")


# --- processes ---------------------------------------------------------------------------


def rss_mib(pid: int | str = "self") -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return math.nan


def cpu_seconds(pid: int | str = "self") -> float:
    """utime + stime of PID (all its threads, not its children); NaN once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    # After the command: state is field 3, utime field 14 and stime field 15 (1-based).
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values[:8]) - idle) / CLK_TCK


@dataclass
class CpuWindow:
    """CPU use of processes between start() and stop(), in percent of one core."""

    pids: dict[str, int | str]
    began: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    machine: float = 0.0

    def start(self) -> CpuWindow:
        self.began = time.monotonic()
        self.cpu = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self.machine = machine_busy_seconds()
        return self

    def stop(self) -> dict[str, float]:
        """Percent of one core per name; `machine` for all cores, `others` for the rest."""
        wall = time.monotonic() - self.began
        result = {}
        for name, before in self.cpu.items():
            result[name] = round(100 * (cpu_seconds(self.pids[name]) - before) / wall, 1)
        result["machine"] = round(100 * (machine_busy_seconds() - self.machine) / wall, 1)
        ours = sum(v for k, v in result.items() if k != "machine" and not math.isnan(v))
        result["others"] = round(result["machine"] - ours, 1)
        return result


def percentiles(values: list[float], scale: float = 1000.0) -> dict[str, float | None]:
    """p50, p90, p99 and max of VALUES (seconds) in milliseconds."""
    if not values:
        return {"p50": None, "p90": None, "p99": None, "max": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * scale, 1)

    return {"p50": at(0.50), "p90": at(0.90), "p99": at(0.99), "max": round(ordered[-1] * scale, 1)}


@dataclass
class GcPauses:
    """This process's garbage collections: with tens of thousands of live objects per
    thousand streams, a full collection can stall the Trio loop for a long time."""

    began: float = 0.0
    pauses: dict[int, list[float]] = field(default_factory=lambda: {0: [], 1: [], 2: []})

    def callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self.began = time.perf_counter()
        else:
            self.pauses[info["generation"]].append(time.perf_counter() - self.began)

    def take(self) -> dict[str, Any]:
        """Collections per generation since the last take: count, total, longest."""
        summary = {
            f"gen{gen}": {
                "count": len(p),
                "total_s": round(sum(p), 2),
                "max_ms": round(max(p, default=0.0) * 1000, 1),
            }
            for gen, p in self.pauses.items()
        }
        for p in self.pauses.values():
            p.clear()
        return summary


async def loop_lag(samples: list[float], stop: trio.Event, every: float = 0.05) -> None:
    """How late this process's Trio loop wakes up: a sign the generator is the bottleneck."""
    while not stop.is_set():
        began = time.monotonic()
        await trio.sleep(every)
        samples.append(time.monotonic() - began - every)


@dataclass(eq=False)
class Meter:
    """Per phase: wall time, CPU of each server process and of this one, their RSS before
    and after, and this process's loop lag."""

    servers: dict[str, ServerProcess]
    others: dict[str, int] = field(default_factory=dict)
    lag: list[float] = field(default_factory=list)
    window: CpuWindow | None = None
    rss: dict[str, float] = field(default_factory=dict)
    began: float = 0.0

    def pids(self) -> dict[str, int | str]:
        servers = {a: s.pid for a, s in self.servers.items()}
        return {**servers, "generator": "self", **self.others}

    def rss_now(self) -> dict[str, float]:
        return {name: rss_mib(pid) for name, pid in self.pids().items()}

    def start(self) -> None:
        self.began = time.monotonic()
        self.window = CpuWindow(self.pids()).start()
        self.rss = self.rss_now()
        self.lag.clear()

    def stop(self) -> dict[str, Any]:
        assert self.window is not None
        after = self.rss_now()
        return {
            "s": round(time.monotonic() - self.began, 1),
            "cpu_pct_of_one_core": self.window.stop(),
            "rss_mib": {name: [self.rss[name], after[name]] for name in after},
            "generator_loop_lag_ms": percentiles(self.lag),
        }


# --- the database's view -----------------------------------------------------------------


def database_view(files: ClusterFiles) -> dict[str, Any]:
    """What the database says: nodes, nodes `node list` shows connected, server backends."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE state = 'accepted'),"
            " count(*) FILTER (WHERE server IS NOT NULL AND last_seen > now() - %s),"
            " count(*) FILTER (WHERE server IS NOT NULL)"
            " FROM nodes",
            (dt.timedelta(seconds=MISSED_HEARTBEATS * HEARTBEAT),),
        ).fetchone()
        backends = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database()"
            " AND application_name = 'orchestrator-zero'"
        ).fetchall()
    assert row is not None
    return {
        "nodes": row[0],
        "accepted": row[1],
        "connected": row[2],
        "with_server": row[3],
        "backend_pids": [int(b[0]) for b in backends],
    }


def membership_age(files: ClusterFiles) -> float:
    """Seconds since the server's last membership heartbeat; past 5 s it counts as down."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM now() - max(last_heartbeat))::float FROM servers"
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else math.inf


async def sample_membership(files: ClusterFiles, ages: list[float], stop: trio.Event) -> None:
    while not stop.is_set():
        ages.append(await trio.to_thread.run_sync(membership_age, files))
        await trio.sleep(1.0)


def servers_up(files: ClusterFiles) -> dict[str, float]:
    """Seconds since each server's last membership heartbeat, by its address."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT advertise, extract(epoch FROM now() - last_heartbeat)::float FROM servers"
        ).fetchall()
    return {str(r[0]): float(r[1]) for r in rows}


async def sample_server_ages(files: ClusterFiles, ages: dict[str, list[float]]) -> None:
    """Every second, each server's seconds since its last membership heartbeat."""
    while True:
        for address, age in (await trio.to_thread.run_sync(servers_up, files)).items():
            ages.setdefault(address, []).append(age)
        await trio.sleep(1.0)


def nodes_in_db(files: ClusterFiles, node_ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """State and server of each of NODE_IDS still in the database."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, state, server FROM nodes WHERE id = ANY(%s)", (node_ids,)
        ).fetchall()
    return {str(r[0]): (str(r[1]), r[2]) for r in rows}


def audit_counts(files: ClusterFiles) -> dict[str, int]:
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT action, count(*) FROM audit_log WHERE action LIKE 'node.%%' GROUP BY action"
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


# --- the servers' logs -------------------------------------------------------------------


TEMPORAL_LEVEL = re.compile(r'^(?:\S+ \S+ \w+ oz0\.temporal\.host: )?\{"level":"(\w+)"')
_EXCEPTION_LINE = re.compile(
    r"^[\s|+]*((?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Closed|Timeout|Group)):"
)


def server_log_summary(text: str) -> dict[str, Any]:
    """Lines per level, the first warnings and errors, and the exceptions in tracebacks."""
    lines = text.splitlines()
    levels: Counter[str] = Counter()
    problems: list[str] = []
    silent = 0
    for line in lines:
        parts = line.split(" ", 4)
        level = parts[2] if len(parts) > 3 else ""
        if level in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            levels[level] += 1
            if level in ("WARNING", "ERROR", "CRITICAL") and len(problems) < 10:
                problems.append(line[:300])
            silent += "silent for three heartbeats" in line
    exceptions = Counter(m[1] for line in lines if (m := _EXCEPTION_LINE.match(line)))
    temporal = Counter(m[1] for line in lines if (m := TEMPORAL_LEVEL.match(line)))
    return {
        "lines": len(lines),
        "levels": dict(levels),
        "streams_closed_as_silent": silent,
        "signals": [line[:120] for line in lines if "received SIG" in line],
        "temporal_host_levels": dict(temporal),
        "first_problems": problems,
        "exceptions": dict(exceptions.most_common(10)),
    }


SERVER_LOG_MARKS = {
    "streams_ended_blocked": "is blocked now; ending its stream",
    "streams_ended_any_state": "now; ending its stream",
    "purged": " purged",
    "purge_not_answered": "did not answer its purge command",
    "purge_refused": "refused a purge command",
    "silent_streams": "silent for three heartbeats",
    "reconcile_failed": "could not reconcile",
    "directory_failed": "could not read the servers that are up",
}


def utc_stamp() -> str:
    """Now, as the Temporal host stamps its log lines."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


_TEMPORAL_PROBLEM = re.compile(
    r"^(?:\S+ \S+ \w+ oz0\.temporal\.host: )?"  # the server's logging, around Temporal's JSON
    r'\{"level":"(warn|error|dpanic|panic|fatal)","ts":"([^"]+)","msg":"([^"]*)"'
)


def server_log(text: str, window: list[str | None]) -> dict[str, Any]:
    """server_log_summary, counts of the lines that matter to blocks and purges, and the
    Temporal host's warnings and errors while the phases ran (WINDOW, UTC): starting and
    stopping three hosts one after the other makes the others complain, which is no news."""
    found = server_log_summary(text)
    lines = text.splitlines()
    found["marks"] = {
        name: sum(mark in line for line in lines) for name, mark in SERVER_LOG_MARKS.items()
    }
    start, end = window[0] or "", window[1] or "9"
    during = Counter(
        f"{m[1]}: {m[3][:80]}"
        for line in lines
        if (m := _TEMPORAL_PROBLEM.match(line)) and start <= m[2] <= end
    )
    found["temporal_host_problems_during_phases"] = dict(during)
    return found
