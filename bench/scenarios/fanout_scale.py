"""`job run --all -- true` on many simulated nodes: the control plane alone (issue 41).

    python -m bench.fanout_scale [--nodes N] [--runs R] [--warmup W] [--servers S]
                                 [--idle SECONDS] [--settle SECONDS] [--join-concurrency C]
                                 [--ramp-batch B] [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and S real servers (default 3, at
most 3) on 127.0.0.225, .239 and .240 (default ports); then, with `oz0-loadgen`
(bench/loadgen/), joins N nodes through .225's edge with a token, C at a time, and holds
their control streams (node i on edge i % S, each from an address of its own in 127.6.x.y)
with `--run-attempts`: each node takes its parts over its stream and answers every one at
once, started then ended exit 0, as a command that printed nothing (no process is forked:
what is measured is the servers, their Temporal hosts and PostgreSQL). Once every node is
connected and has said it takes attempts over its stream (the database says so), it
measures the control plane idle for IDLE seconds, then runs W jobs not counted (warm-up)
and R counted, one after another, each `POST /api/v1/jobs` {"command": ["true"], "all":
true} through .225's API as `orchestrator-zero job run --all -- true` sends it (one kept
`cli.client.ApiClient`), the job's row polled every 10 ms on a connection of its own:

- request → job ended: from just before the request to the job's `ended_at` (the
  servers' clock, this machine's: the same wall clock); also to the last part placed (its
  `started_at`) and to the last part ended, the API call, and when the poll saw the end;
- every part checked: N parts, one a node, each ended `exit` 0, the job `succeeded`;
- the control plane's CPU-seconds for the job: each server process, its Temporal host, and
  this cluster's PostgreSQL backends (pg_stat_activity, less the poller's), from just
  before the request to SETTLE seconds after the end (the workflow's completion and the
  acks come after `ended_at`), raw and less the idle rate over the same time; and, apart,
  PostgreSQL's whole process tree (its WAL writer and checkpointer too: on a shared
  machine, the other users' backends also);
- the generator's counts for the job (attempts started, ends sent again, acks
  `unavailable`).

Summary: request → ended p50 and max (and the others) over the R runs, CPU-s a job p50 and
max, and whether every run ended within 2 s. A job that does not end within JOB_TIMEOUT,
or whose parts are not all `exit` 0, fails the run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from bench import loadgen
from bench.measure import cpu_seconds, machine_busy_seconds, percentiles, utc_stamp
from bench.runner import Bench, Scenario, create_token, log
from bench.scenarios.jobs import cluster_backends
from bench.scenarios.salt_side_by_side import cpu_with_reaped, postgres_tree
from cli.client import ApiClient
from fixtures.cluster import ClusterFiles
from oz0 import context as oz0_context
from oz0.context import MANAGEMENT_PORT, Context

ADDRESSES = ("127.0.0.225", "127.0.0.239", "127.0.0.240")
# Each node connects from an address of its own, as distinct machines: 127.6.(i/250).(i%250+1).
SOURCES = "127.6"
COMMAND = ["true"]
GOAL_S = 2.0
# Bounds, so that a cluster that stops answering cannot keep the run going.
RAMP_TIMEOUT = 300.0
JOB_TIMEOUT = 60.0
POLL = 0.01


class Failed(Exception):
    """A job did not do what the benchmark needs."""


# --- the control plane's CPU -------------------------------------------------------------


@dataclass
class ControlPlane:
    """The control plane's processes: the servers, their Temporal hosts, this cluster's
    PostgreSQL backends (less EXCLUDED, the benchmark's own), and PostgreSQL's whole tree."""

    bench: Bench
    excluded: set[int] = field(default_factory=set)

    def pids(self) -> dict[str, list[int]]:
        servers = [s.pid for s in self.bench.servers.values()]
        hosts = [p for s in self.bench.servers.values() for p in s.started_children]
        backends = [p for p in cluster_backends(self.bench.files) if p not in self.excluded]
        return {
            "servers": servers,
            "temporal_hosts": hosts,
            "postgres_backends": backends,
            "postgres_all": postgres_tree(),
        }

    def reading(self) -> Reading:
        pids = self.pids()
        each = {pid: cpu_seconds(pid) for group in pids.values() for pid in group}
        # PostgreSQL's tree with what its postmaster reaped (backends that ended meanwhile).
        reaped = cpu_with_reaped(pids["postgres_all"])
        return Reading(time.monotonic(), machine_busy_seconds(), pids, each, reaped)


@dataclass
class Reading:
    at: float
    machine: float
    pids: dict[str, list[int]]
    each: dict[int, float]
    postgres_all: float

    def since(self, before: Reading) -> dict[str, float]:
        """CPU-seconds each group spent since BEFORE (processes in both readings; a backend
        that began meanwhile counts from zero), with `control_plane` (servers, hosts and
        backends), `machine` (all cores) and the wall time `s`."""
        spent: dict[str, float] = {}
        for group in ("servers", "temporal_hosts", "postgres_backends"):
            total = 0.0
            for pid in self.pids[group]:
                now, then = self.each.get(pid, math.nan), before.each.get(pid, 0.0)
                if not math.isnan(now):
                    total += now - (0.0 if math.isnan(then) else then)
            spent[group] = total
        spent["control_plane"] = sum(spent.values())
        spent["postgres_all"] = self.postgres_all - before.postgres_all
        spent["machine"] = self.machine - before.machine
        spent["s"] = self.at - before.at
        return {k: round(v, 4) for k, v in spent.items()}


# --- one job -------------------------------------------------------------------------------


@dataclass
class Poller:
    """One database connection of the benchmark's own, reading the job's row."""

    conn: psycopg.Connection[Any]

    @property
    def backend(self) -> int:
        return int(self.conn.info.backend_pid)

    def until_ended(self, job_id: str, within: float) -> tuple[str, float, float]:
        """(state, ended_at as epoch seconds, time.time() when seen) once it has ended."""
        deadline = time.monotonic() + within
        while True:
            row = self.conn.execute(
                "SELECT state, extract(epoch FROM ended_at)::float FROM jobs WHERE id = %s",
                (job_id,),
            ).fetchone()
            if row is not None and row[1] is not None:
                return str(row[0]), float(row[1]), time.time()
            if time.monotonic() > deadline:
                state = row[0] if row else "no row"
                raise Failed(f"job {job_id} did not end within {within:g} s ({state})")
            time.sleep(POLL)

    def parts(self, job_id: str) -> list[tuple[str, str, int | None, str | None, float, float]]:
        """(node, state, exit code, ended because, started_at, ended_at) of each part."""
        rows = self.conn.execute(
            "SELECT node_id, state, exit_code, ended_because,"
            " extract(epoch FROM started_at)::float, extract(epoch FROM ended_at)::float"
            " FROM job_attempts WHERE job_id = %s",
            (job_id,),
        ).fetchall()
        return [
            (str(r[0]), str(r[1]), r[2], r[3], float(r[4]), float(r[5] or math.nan)) for r in rows
        ]


def run_one(client: ApiClient, poller: Poller, nodes: int) -> dict[str, Any]:
    """One `job run --all -- true` through the API, until its row says it ended."""
    sent = time.time()
    job = client.post("/api/v1/jobs", {"tenant": "default", "command": COMMAND, "all": True})
    answered = time.time()
    job_id = str(job["id"])
    state, ended_at, seen = poller.until_ended(job_id, JOB_TIMEOUT)
    parts = poller.parts(job_id)
    bad = [p for p in parts if (p[1], p[2], p[3]) != ("ended", 0, "exit")]
    result = {
        "job": job_id,
        "state": state,
        "parts": len(parts),
        "nodes_used": len({p[0] for p in parts}),
        "parts_not_exit_0": [f"{p[0]}: {p[1]} {p[3]} {p[2]}" for p in bad][:5],
        "api_call_s": round(answered - sent, 4),
        "request_to_last_part_placed_s": round(max(p[4] for p in parts) - sent, 4)
        if parts
        else None,
        "request_to_last_part_ended_s": round(max(p[5] for p in parts) - sent, 4)
        if parts
        else None,
        "request_to_job_ended_s": round(ended_at - sent, 4),
        "request_to_end_seen_s": round(seen - sent, 4),
    }
    if state != "succeeded" or bad or len(parts) != nodes or result["nodes_used"] != nodes:
        raise Failed(f"job {job_id} did not run `true` once on each of {nodes} nodes: {result}")
    return result


# --- the scenario --------------------------------------------------------------------------


@dataclass
class Fleet:
    """The generator's latest stats line."""

    stats: dict[str, Any] = field(default_factory=dict)

    def attempts(self) -> dict[str, int]:
        return dict(self.stats.get("attempts", {}))


async def read_stats(held: loadgen.Held, fleet: Fleet) -> None:
    async for event in held:
        if event.get("event") == "stats":
            fleet.stats = event


def connected_by_stream(files: ClusterFiles) -> int:
    """Nodes connected now whose latest stream said it takes attempts over it."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM nodes WHERE state = 'accepted' AND server IS NOT NULL"
            " AND last_seen > now() - interval '15 seconds' AND attempts_by_stream"
        ).fetchone()
    return int(row[0]) if row else 0


async def run(bench: Bench) -> None:
    args, files, out = bench.args, bench.files, bench.out
    edges = bench.edges
    ca_file = files.context_dir / oz0_context.CA_FILE
    token = await trio.to_thread.run_sync(create_token, files, "bench.fanout_scale")
    nodes_dir = bench.root / "nodes"
    out["join"] = await loadgen.join(
        edges[0], ca_file, token, nodes_dir, nodes=args.nodes, concurrency=args.join_concurrency
    )
    joined = int(out["join"]["joined"])
    log(f"joins: {json.dumps(out['join'])}")
    if joined != args.nodes:
        raise Failed(f"{joined} of {args.nodes} nodes joined")
    extra = ["--run-attempts", "--quiet-events", "--stats-every", "1"]
    extra += ["--ramp-batch", str(args.ramp_batch), "--source-per-node", SOURCES]
    fleet = Fleet()
    context = dataclasses.replace(
        Context.load(files.context_path), servers=(f"{ADDRESSES[0]}:{MANAGEMENT_PORT}",)
    )
    client = ApiClient(context, learn_servers=False)
    async with loadgen.hold(edges, ca_file, nodes_dir, extra=extra) as held:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stats, held, fleet)
            began = time.monotonic()
            ready = 0
            with trio.move_on_after(RAMP_TIMEOUT):
                # The database is polled: nothing here is told when a node's row changes.
                while True:
                    ready = await trio.to_thread.run_sync(connected_by_stream, files)
                    if ready >= joined:
                        break
                    await trio.sleep(0.5)
            out["ramp"] = {
                "s": round(time.monotonic() - began, 1),
                "taking_attempts_over_their_stream": ready,
            }
            log(f"ramp: {json.dumps(out['ramp'])}")
            if ready < joined:
                raise Failed(f"only {ready} of {joined} nodes take attempts over their stream")
            await trio.to_thread.run_sync(measure, bench, client, fleet, joined)
            nursery.cancel_scope.cancel()
        out["generator_summary"] = await held.stop()


def measure(bench: Bench, client: ApiClient, fleet: Fleet, nodes: int) -> None:
    """Idle, then the warm-up and counted jobs one after another (blocking: in a thread)."""
    args, out = bench.args, bench.out
    url = bench.files.main_db
    with psycopg.connect(url, autocommit=True) as conn:
        poller = Poller(conn)
        plane = ControlPlane(bench, {poller.backend})
        time.sleep(args.settle)
        out["phases_utc"] = [utc_stamp(), None]
        before = plane.reading()
        time.sleep(args.idle)
        idle = plane.reading().since(before)
        idle_rate = {k: v / idle["s"] for k, v in idle.items() if k != "s"}
        out["idle"] = {
            "s": idle["s"],
            "cpu_pct_of_one_core": {k: round(100 * v, 1) for k, v in idle_rate.items()},
            "streams_alive": fleet.stats.get("streams_alive"),
        }
        log(f"idle: {json.dumps(out['idle'])}")
        runs: list[dict[str, Any]] = []
        warmups: list[dict[str, Any]] = []
        for i in range(args.warmup + args.runs):
            counts = fleet.attempts()
            before = plane.reading()
            result = run_one(client, poller, nodes)
            time.sleep(args.settle)
            spent = plane.reading().since(before)
            result["cpu_s"] = spent
            result["cpu_s_less_idle"] = {
                k: round(v - idle_rate.get(k, 0.0) * spent["s"], 4)
                for k, v in spent.items()
                if k not in ("s", "machine")
            }
            result["machine_busy_s"] = spent["machine"]
            after = fleet.attempts()
            result["generator_attempts"] = {k: after.get(k, 0) - counts.get(k, 0) for k in after}
            (warmups if i < args.warmup else runs).append(result)
            kind = "warm-up" if i < args.warmup else f"run {i - args.warmup + 1}/{args.runs}"
            log(
                f"{kind}: {result['job']} ended {result['request_to_job_ended_s']:.3f} s after"
                f" the request; control plane {spent['control_plane']:.3f} CPU-s"
            )
        out["phases_utc"][1] = utc_stamp()
    out["warmup"] = warmups
    out["runs"] = runs
    out["summary"] = summary(runs, nodes)
    log(f"summary: {json.dumps(out['summary'])}")


def summary(runs: list[dict[str, Any]], nodes: int) -> dict[str, Any]:
    def times(key: str) -> dict[str, float | None]:
        return percentiles([r[key] for r in runs if r[key] is not None])

    def cpu(key: str, group: str) -> dict[str, float]:
        values = sorted(r[key][group] for r in runs)
        return {"p50": round(values[len(values) // 2], 3), "max": round(values[-1], 3)}

    ended = [r["request_to_job_ended_s"] for r in runs]
    groups = ("control_plane", "servers", "temporal_hosts", "postgres_backends", "postgres_all")
    return {
        "nodes": nodes,
        "runs": len(runs),
        "request_to_job_ended_ms": times("request_to_job_ended_s"),
        "request_to_last_part_ended_ms": times("request_to_last_part_ended_s"),
        "request_to_last_part_placed_ms": times("request_to_last_part_placed_s"),
        "request_to_end_seen_ms": times("request_to_end_seen_s"),
        "api_call_ms": times("api_call_s"),
        "cpu_s_per_job": {g: cpu("cpu_s", g) for g in groups},
        "cpu_s_per_job_less_idle": {g: cpu("cpu_s_less_idle", g) for g in groups},
        f"every_run_ended_within_{GOAL_S:g}s": bool(ended) and max(ended) < GOAL_S,
        f"p50_ended_within_{GOAL_S:g}s": bool(ended) and sorted(ended)[len(ended) // 2] < GOAL_S,
    }


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000, help="simulated nodes")
    parser.add_argument("--runs", type=int, default=10, help="jobs counted, one at a time")
    parser.add_argument("--warmup", type=int, default=1, help="jobs before, not counted")
    parser.add_argument("--servers", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--idle", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument(
        "--settle", type=float, default=3.0, help="seconds after each job's end, in its CPU"
    )
    parser.add_argument("--join-concurrency", type=int, default=16)
    parser.add_argument("--ramp-batch", type=int, default=200)


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 1 or args.runs < 1 or args.warmup < 0 or args.idle <= 0:
        return "--nodes and --runs must be at least 1, --warmup not negative, --idle positive"
    if args.settle < 0 or args.join_concurrency < 1 or args.ramp_batch < 1:
        return "--settle must not be negative, --join-concurrency and --ramp-batch positive"
    return None


def build_loadgen(_bench: Bench) -> None:
    loadgen.build()


SCENARIO = Scenario(
    "fanout_scale",
    __doc__ or "",
    arguments,
    run,
    servers=lambda args: ADDRESSES[: args.servers],
    check=check,
    before_servers=build_loadgen,
    measured=("oz0", "cli", "bench/loadgen"),
)
