"""Edge load: joins per second, and what thousands of idle control streams cost a server.

    python -m bench.edge_load [--nodes N] [--idle SECONDS] [--join-concurrency C]
                              [--ramp-batch B] [--server-log PATH] [--no-gc-freeze]
                              [--address IP]

Starts a fresh test cluster (the suite's PostgreSQL, see fixtures/postgres.py) and ONE
real server on 127.0.0.41 (or --address), then from this one process:

1. creates a join token (tenant default, unlimited uses, no expiry) through the data layer;
2. makes N P-256 keys and certificate requests (not timed), then joins the N nodes through
   the edge's `/join` with that token, C at a time: wall time, joins per second, latency;
3. opens N control streams with each node's own certificate, in batches of B, each read by
   a Trio task of its own; one task sends every stream's heartbeat every 5 s and ends a
   stream that heard nothing for three (docs/node-protocol.md);
4. keeps them idle for SECONDS and measures the RSS and CPU of the server process (and of
   this process), heartbeat gaps, and how many streams are still alive at the end;
5. closes the streams, stops the server and prints one JSON document.

Every phase has a time bound, and the run stops early if the server exits (or on SIGTERM,
still stopping the server and dropping the databases), so it ends by itself whatever the
server does. Progress goes to stderr, the JSON to stdout. This process's long-lived
objects are frozen out of garbage collection (gc.freeze) so that full collections do not
stall its event loop; --no-gc-freeze turns that off.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import math
import os
import platform
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio
from trio_websocket import WebSocketConnection, wrap_client_stream

from fixtures import edge_client
from fixtures.cluster import ClusterFiles, ServerProcess, initialise
from fixtures.edge_client import NodeKeys
from fixtures.postgres import fresh_database_url
from oz0 import audit, pki, tokens

ADDRESS = "127.0.0.41"
PORT = 7443
EDGE = f"{ADDRESS}:{PORT}"
HEARTBEAT = 5.0
MISSED_HEARTBEATS = 3
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Bounds, so that a server that stops answering cannot keep the run going. A stream that
# fails takes at most CONNECT + 2 * ANSWER + DISCONNECT to say so, less than BATCH_TIMEOUT.
CONNECT_TIMEOUT = 30.0
ANSWER_TIMEOUT = 40.0
DISCONNECT_TIMEOUT = 10.0
BATCH_TIMEOUT = 150.0
CLOSE_TIMEOUT = 60.0
SERVER_START_TIMEOUT = 180.0


def source_version(measured: Sequence[str] = ("oz0", "cli")) -> str:
    """The commit this checkout is at, and whether the code measured (the directories
    MEASURED) had uncommitted changes, and in which files."""
    repo = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
        return done.stdout.rstrip("\n") if done.returncode == 0 else "?"

    commit = git("rev-parse", "--short", "HEAD").strip()
    if commit == "?":
        return "? (not a git checkout)"
    # Porcelain lines are "XY PATH": two status letters (either may be a space), a space.
    dirty = [line[3:] for line in git("status", "--porcelain", "--", *measured).splitlines()]
    return commit + (f" with uncommitted changes in {', '.join(dirty)}" if dirty else "")


def log(message: str) -> None:
    """Progress on stderr, named after the benchmark that runs (python -m bench.NAME)."""
    program = Path(sys.argv[0]).stem
    print(f"[{program} {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "openssl": ssl.OPENSSL_VERSION,
        "load_average_at_start": os.getloadavg(),
    }


class ServerExited(Exception):
    pass


class Terminated(Exception):
    """SIGTERM or SIGHUP: stop, but still stop the server and drop the databases."""


def on_terminate_signal(signum: int, _frame: object) -> None:
    raise Terminated(f"received {signal.Signals(signum).name}")


async def watch_signals() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGHUP) as signals:
        async for signum in signals:
            raise Terminated(f"received {signal.Signals(signum).name}")


# --- measuring processes ---------------------------------------------------------------


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


def failure_text(e: BaseException) -> str:
    """One line for a run that failed: the first error inside any exception group."""
    inner = e
    while isinstance(inner, BaseExceptionGroup):
        inner = inner.exceptions[0]
    return f"{error_name(e)}: {inner}"[:2000]


def error_name(e: BaseException) -> str:
    """A short name for what went wrong, the innermost leaf of an exception group."""
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    if isinstance(e, OSError) and e.errno is not None:
        return f"{type(e).__name__}[{e.errno}]"
    cause = e.__cause__ or e.__context__
    if type(e).__name__ == "HandshakeError" and cause is not None:
        return f"HandshakeError({error_name(cause)})"
    return type(e).__name__


# --- the cluster -------------------------------------------------------------------------


def create_token(files: ClusterFiles, description: str = "bench.edge_load") -> str:
    """A join token for tenant default, unlimited uses, no expiry, made as an operator."""
    with (
        psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn,
        conn.transaction(),
    ):
        _, token = tokens.create(
            conn,
            tenant="default",
            ttl=None,
            max_uses=0,
            labels={},
            description=description,
            actor=audit.Actor("operator", "bench"),
        )
    return token


def database_view(files: ClusterFiles) -> dict[str, Any]:
    """What the database says: nodes, nodes `node list` shows connected, server backends."""
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
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
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
        row = conn.execute(
            "SELECT extract(epoch FROM now() - max(last_heartbeat))::float FROM servers"
        ).fetchone()
    return float(row[0]) if row and row[0] is not None else math.inf


async def sample_membership(files: ClusterFiles, ages: list[float], stop: trio.Event) -> None:
    while not stop.is_set():
        ages.append(await trio.to_thread.run_sync(membership_age, files))
        await trio.sleep(1.0)


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


async def watch_server(server: ServerProcess, phase: list[str]) -> None:
    """End the run as soon as the server exits: there is nothing left to measure."""
    assert server.process is not None
    while True:
        await trio.sleep(0.5)
        code = server.process.poll()
        if code is not None:
            when = time.strftime("%H:%M:%S")
            raise ServerExited(f"server exited with code {code} at {when} during {phase[0]}")


def source_address(index: int) -> str:
    """The loopback address node INDEX connects from: nodes are distinct machines, and the
    edge admits at most 64 unauthenticated connections per source address."""
    return f"127.3.{index // 250}.{index % 250 + 1}"


@asynccontextmanager
async def open_edge(
    path: str, ctx: ssl.SSLContext, edge: str = EDGE, source: str | None = None
) -> AsyncIterator[tuple[WebSocketConnection, dict[str, Any]]]:
    """Like fixtures.edge_client.connect, with this benchmark's bounds, from SOURCE."""
    host, _, port = edge.rpartition(":")
    stream: trio.SSLStream[trio.SocketStream] | None = None
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            tcp = await trio.open_tcp_stream(host, int(port), local_address=source)
            stream = trio.SSLStream(tcp, ctx, server_hostname=host)
        async with trio.open_nursery() as nursery:
            with trio.fail_after(CONNECT_TIMEOUT):
                ws = await wrap_client_stream(nursery, stream, host, path)
            try:
                yield ws, await answer(ws)
            finally:
                with trio.move_on_after(DISCONNECT_TIMEOUT):
                    await ws.aclose()
    finally:
        if stream is not None:
            await trio.aclose_forcefully(stream)


async def answer(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(ANSWER_TIMEOUT):
        message = json.loads(await ws.get_message())
    if not isinstance(message, dict):
        raise ValueError(f"not a JSON object: {message!r}")
    return message


# --- phase 2: joins ----------------------------------------------------------------------


@dataclass
class Node:
    keys: NodeKeys
    csr: str
    ctx: ssl.SSLContext | None = None


@dataclass
class JoinResults:
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    joined: list[Node] = field(default_factory=list)


async def join_one(
    node: Node, index: int, token: str, ctx: ssl.SSLContext, results: JoinResults, edge: str = EDGE
) -> None:
    began = time.perf_counter()
    try:
        async with open_edge("/join", ctx, edge, source_address(index)) as (ws, _hello):
            await edge_client.send(
                ws,
                "join",
                csr=node.csr,
                token=token,
                labels={"bench": "edge-load"},
                hostname=f"bench-{index}",
            )
            joined = await answer(ws)
            latency = time.perf_counter() - began
    except Exception as e:
        results.errors[error_name(e)] += 1
        return
    if joined.get("type") != "joined" or joined.get("state") != "accepted":
        detail = joined.get("code", joined.get("state"))
        results.errors[f"answer:{joined.get('type')}:{detail}"] += 1
        return
    node.keys.node_id = str(joined["node_id"])
    node.keys.cert_pem = str(joined["certificate"]).encode()
    results.latencies.append(latency)
    results.joined.append(node)


async def join_all(
    nodes: list[Node],
    token: str,
    ca_pem: bytes,
    concurrency: int,
    time_limit: float,
    edges: Sequence[str] = (EDGE,),
) -> tuple[JoinResults, float, bool]:
    """Join NODES with CONCURRENCY joins in flight, node i through EDGES[i % len(EDGES)];
    (results, wall seconds, timed out). RESULTS.joined is in the order the joins ended."""
    ctx = edge_client.verified_context(ca_pem)
    results = JoinResults()
    next_index = 0
    report_every = max(1, len(nodes) // 10)

    async def worker() -> None:
        nonlocal next_index
        while next_index < len(nodes):
            index = next_index
            next_index += 1
            edge = edges[index % len(edges)]
            await join_one(nodes[index], index, token, ctx, results, edge)
            done = len(results.latencies) + sum(results.errors.values())
            if done % report_every == 0:
                log(f"joins: {done}/{len(nodes)} done, errors {dict(results.errors)}")

    began = time.perf_counter()
    with trio.move_on_after(time_limit) as scope:
        async with trio.open_nursery() as nursery:
            for _ in range(min(concurrency, len(nodes))):
                nursery.start_soon(worker)
    return results, time.perf_counter() - began, scope.cancelled_caught


# --- phase 3 and 4: control streams --------------------------------------------------------


@dataclass
class Streams:
    """What the control streams saw, shared by all their tasks."""

    # The live part of each open stream, cancelled to stop it; then it closes gracefully.
    live: dict[int, Live] = field(default_factory=dict)
    stopping: bool = False
    all_closed: trio.Event = field(default_factory=trio.Event)
    # How many tasks are in each phase: connecting (TCP, TLS, upgrade and hello),
    # welcome (waiting for it), live, closing.
    phases: Counter[str] = field(default_factory=Counter)
    connect_latencies: list[float] = field(default_factory=list)
    welcomed: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)
    ended: Counter[str] = field(default_factory=Counter)
    close_errors: Counter[str] = field(default_factory=Counter)
    received: Counter[str] = field(default_factory=Counter)
    edges: Counter[str] = field(default_factory=Counter)
    heartbeats_sent: int = 0
    heartbeat_errors: Counter[str] = field(default_factory=Counter)
    # Open streams (welcomed, not yet closed): when each last heard from the edge.
    last_message: dict[int, float] = field(default_factory=dict)
    measuring: bool = False
    gaps: int = 0
    gaps_over_6s: int = 0
    gaps_over_10s: int = 0
    max_gap: float = 0.0

    @property
    def open(self) -> int:
        return len(self.last_message)

    def alive(self) -> int:
        """Open streams that heard from the edge within three heartbeats."""
        now = trio.current_time()
        limit = MISSED_HEARTBEATS * HEARTBEAT
        return sum(1 for last in self.last_message.values() if now - last < limit)

    def snapshot(self) -> dict[str, Any]:
        return {
            "welcomed": self.welcomed,
            "open": self.open,
            "phases": {k: v for k, v in self.phases.items() if v},
            "errors": dict(self.errors),
            "refused": dict(self.refused),
            "ended": dict(self.ended),
        }

    def enter(self, old: str | None, new: str | None) -> str | None:
        if old is not None:
            self.phases[old] -= 1
        if new is not None:
            self.phases[new] += 1
        return new

    def saw(self, index: int, message: str, now: float) -> dict[str, Any]:
        """Note a message from the edge on stream INDEX; the message, parsed ({} if not)."""
        previous = self.last_message.get(index)
        self.last_message[index] = now
        if self.measuring and previous is not None:
            gap = now - previous
            self.gaps += 1
            self.gaps_over_6s += gap > 6.0
            self.gaps_over_10s += gap > 10.0
            self.max_gap = max(self.max_gap, gap)
        try:
            parsed = json.loads(message)
            kind = str(parsed.get("type", "?"))
        except (ValueError, AttributeError):
            parsed, kind = {}, "not-json"
        self.received[kind] += 1
        if kind == "edges":
            self.edges[",".join(parsed.get("edges") or []) or "(none)"] += 1
        return parsed if isinstance(parsed, dict) else {}

    def stop(self) -> None:
        self.stopping = True
        for live in self.live.values():
            live.scope.cancel()
        self.check_closed()

    def check_closed(self) -> None:
        if self.stopping and not self.last_message:
            self.all_closed.set()


HEARTBEAT_MESSAGE = json.dumps({"type": "heartbeat"})
# How often the heartbeat task looks at every stream; a heartbeat may come this late.
TICK = 0.5


@dataclass
class Live:
    """A welcomed stream, between welcome and stop."""

    ws: WebSocketConnection
    next_heartbeat: float
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    silent: bool = False


@dataclass(eq=False)
class Heartbeats:
    """Heartbeats for every stream from one task. A task per stream sleeping between
    heartbeats costs the generator far more: each timeout in Trio is an exception, and
    the objects that live across the wait fill Python's oldest GC generation."""

    streams: Streams
    nursery: trio.Nursery

    async def run(self) -> None:
        silence = MISSED_HEARTBEATS * HEARTBEAT
        while True:
            await trio.sleep(TICK)
            if self.streams.stopping:
                return
            now = trio.current_time()
            last_message = self.streams.last_message
            for index, live in self.streams.live.items():
                if now - last_message.get(index, now) >= silence:
                    live.silent = True  # three heartbeats without a word: dead
                    live.scope.cancel()
                elif now >= live.next_heartbeat:
                    live.next_heartbeat = now + HEARTBEAT
                    self.nursery.start_soon(self.send, live.ws)

    async def send(self, ws: WebSocketConnection) -> None:
        try:
            with trio.move_on_after(ANSWER_TIMEOUT):
                await ws.send_message(HEARTBEAT_MESSAGE)
                self.streams.heartbeats_sent += 1
        except Exception as e:
            self.streams.heartbeat_errors[error_name(e)] += 1


async def hold(ws: WebSocketConnection, index: int, streams: Streams) -> str:
    """Read the edge until stopped ("stopped") or until the heartbeat task finds three
    heartbeats passed without a message from the edge ("silent": the stream is dead)."""
    live = Live(ws, trio.current_time() + HEARTBEAT)
    streams.live[index] = live
    try:
        with live.scope:
            while True:
                message = await ws.get_message()
                streams.saw(index, str(message), trio.current_time())
    finally:
        del streams.live[index]
    return "silent" if live.silent else "stopped"


async def control_stream(
    index: int, node: Node, streams: Streams, settled: trio.MemorySendChannel[None]
) -> None:
    """One node's control stream, from connect to stop (or until it dies). Tells SETTLED
    once, when it has been welcomed or has failed to be."""
    assert node.ctx is not None
    phase = streams.enter(None, "connecting")
    told = False
    began = trio.current_time()
    # Bounds connecting and the two first answers from outside open_websocket: when its
    # own connect_timeout fires, trio-websocket 0.12.2 still waits for its reader task.
    with trio.CancelScope(deadline=began + CONNECT_TIMEOUT + 2 * ANSWER_TIMEOUT) as bound:
        try:
            async with open_edge("/control", node.ctx, EDGE, source_address(index)) as (ws, _hello):
                phase = streams.enter(phase, "welcome")
                first = await answer(ws)
                if first.get("type") != "welcome":
                    streams.refused[str(first.get("code", first.get("type")))] += 1
                    return
                bound.deadline = math.inf
                streams.connect_latencies.append(trio.current_time() - began)
                streams.welcomed += 1
                streams.last_message[index] = trio.current_time()
                phase = streams.enter(phase, "live")
                told = True
                settled.send_nowait(None)
                streams.ended[await hold(ws, index, streams)] += 1
                phase = streams.enter(phase, "closing")
        except Exception as e:
            if phase == "live":
                streams.ended[error_name(e)] += 1
            elif phase == "closing":
                streams.close_errors[error_name(e)] += 1
            else:
                streams.errors[f"{phase}:{error_name(e)}"] += 1
        finally:
            if not told:
                settled.send_nowait(None)
            streams.enter(phase, None)
            streams.last_message.pop(index, None)
            streams.check_closed()
    if bound.cancelled_caught:
        streams.errors[f"{phase}:timeout"] += 1


async def loop_lag(samples: list[float], stop: trio.Event, every: float = 0.05) -> None:
    """How late this process's Trio loop wakes up: a sign the generator is the bottleneck."""
    while not stop.is_set():
        began = time.monotonic()
        await trio.sleep(every)
        samples.append(time.monotonic() - began - every)


# --- the run -----------------------------------------------------------------------------


async def run_load(
    args: argparse.Namespace, files: ClusterFiles, server: ServerProcess, out: dict[str, Any]
) -> None:
    phase = ["setup"]
    streams = Streams()
    out["progress"] = streams.snapshot
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses.callback)
    try:
        async with trio.open_nursery() as watchdog:
            watchdog.start_soon(watch_server, server, phase)
            watchdog.start_soon(watch_signals)
            await measure(args, files, server, out, phase, streams, gc_pauses)
            watchdog.cancel_scope.cancel()
    finally:
        gc.callbacks.remove(gc_pauses.callback)


async def measure(
    args: argparse.Namespace,
    files: ClusterFiles,
    server: ServerProcess,
    out: dict[str, Any],
    phase: list[str],
    streams: Streams,
    gc_pauses: GcPauses,
) -> None:
    n = args.nodes
    ca_pem, ca_hash = await edge_client.fetch_ca(EDGE)
    if ca_hash != files.ca_hash or pki.ca_hash(pki.cert_from_pem(ca_pem)) != ca_hash:
        raise RuntimeError(f"edge presents CA {ca_hash}, cluster has {files.ca_hash}")
    token = await trio.to_thread.run_sync(create_token, files)

    # Keys and certificate requests before anything is timed: we measure the server.
    began = time.perf_counter()
    nodes = []
    for _ in range(n):
        keys = NodeKeys.new()
        keys.ca_pem = ca_pem
        nodes.append(Node(keys, keys.csr_pem()))
    out["client_prep"] = {"keys_and_csrs_s": round(time.perf_counter() - began, 2)}
    log(f"{n} keys and CSRs in {out['client_prep']['keys_and_csrs_s']} s")

    phase[0] = "joins"
    server_rss_start = rss_mib(server.pid)
    ours: dict[str, int | str] = {"server": server.pid, "generator": "self"}
    cpu = CpuWindow(ours).start()
    results, wall, timed_out = await join_all(
        nodes, token, ca_pem, args.join_concurrency, time_limit=max(300.0, n * 0.2), edges=(EDGE,)
    )
    ok = len(results.latencies)
    out["join"] = {
        "concurrency": args.join_concurrency,
        "attempted": n,
        "accepted": ok,
        "errors": dict(results.errors),
        "timed_out": timed_out,
        "wall_s": round(wall, 2),
        "joins_per_s": round(ok / wall, 1) if wall > 0 else None,
        "latency_ms": percentiles(results.latencies),
        "cpu_pct": cpu.stop(),
    }
    log(f"joins: {json.dumps(out['join'])}")

    # Each node's own TLS context (its certificate as client certificate); not timed.
    phase[0] = "client TLS contexts"
    began = time.perf_counter()
    generator_rss_before = rss_mib()
    for node in results.joined:
        node.ctx = edge_client.verified_context(ca_pem, node.keys)
    out["client_prep"]["tls_contexts_s"] = round(time.perf_counter() - began, 2)
    out["client_prep"]["tls_contexts_rss_mib"] = round(rss_mib() - generator_rss_before, 1)
    if args.gc_freeze:
        # Keys, contexts and the rest are here for good: keep full collections off them.
        gc.collect()
        gc.freeze()

    db_before = await trio.to_thread.run_sync(database_view, files)
    await trio.sleep(2)  # let the join burst settle before the baseline
    server_rss_before = rss_mib(server.pid)
    generator_rss_before = rss_mib()

    lag: list[float] = []
    lag_stop = trio.Event()
    joined = results.joined
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop_lag, lag, lag_stop)
        nursery.start_soon(Heartbeats(streams, nursery).run)
        # Ramp up in batches: the next batch starts when every stream of this one has
        # been welcomed or has failed.
        phase[0] = "ramp"
        began = time.perf_counter()
        cpu = CpuWindow(ours).start()
        segment = CpuWindow(ours).start()
        gc_pauses.take()
        progress: list[dict[str, Any]] = []
        ramp_timed_out = False
        batches = range(0, len(joined), args.ramp_batch)
        report_every = max(1, 1000 // args.ramp_batch)
        for number, start in enumerate(batches):
            batch = joined[start : start + args.ramp_batch]
            send, receive = trio.open_memory_channel[None](len(batch))
            for offset, node in enumerate(batch):
                nursery.start_soon(control_stream, start + offset, node, streams, send)
            with trio.move_on_after(BATCH_TIMEOUT) as scope:
                for _ in batch:
                    await receive.receive()
            if args.gc_freeze:
                gc.freeze()  # the batch's connections live until the end
            if scope.cancelled_caught:
                ramp_timed_out = True
                log(f"batch at {start} not settled in {BATCH_TIMEOUT} s: {streams.snapshot()}")
                break
            if (number + 1) % report_every == 0 or start + len(batch) == len(joined):
                progress.append(
                    {
                        "welcomed": streams.welcomed,
                        "s": round(time.perf_counter() - began, 1),
                        "cpu_pct": segment.stop(),
                        "loop_lag_ms": percentiles(lag)["max"],
                    }
                )
                segment.start()
                lag.clear()
                log(f"streams: {json.dumps(progress[-1])} {streams.snapshot()}")
        ramp = time.perf_counter() - began
        out["control"] = {
            "ramp_batch": args.ramp_batch,
            "attempted": len(joined),
            "welcomed": streams.welcomed,
            "refused": dict(streams.refused),
            "errors": dict(streams.errors),
            "ramp_timed_out": ramp_timed_out,
            "ramp_s": round(ramp, 2),
            "streams_per_s": round(streams.welcomed / ramp, 1) if ramp > 0 else None,
            "connect_latency_ms": percentiles(streams.connect_latencies),
            "cpu_pct": cpu.stop(),
            "generator_gc": gc_pauses.take(),
            "progress": progress,
        }
        log(f"ramp: {json.dumps(out['control'])}")

        # Idle: every stream only heartbeats.
        phase[0] = "idle"
        server_rss_with = rss_mib(server.pid)
        lag.clear()
        streams.measuring = True
        backends = db_before["backend_pids"]
        window = CpuWindow({**ours, **{f"pg{pid}": pid for pid in backends}}).start()
        log(f"idle for {args.idle} s with {streams.open} streams")
        ages: list[float] = []
        sampled = trio.Event()
        nursery.start_soon(sample_membership, files, ages, sampled)
        await trio.sleep(args.idle)
        sampled.set()
        used = window.stop()
        streams.measuring = False
        alive_at_end = streams.alive()
        db_idle = await trio.to_thread.run_sync(database_view, files)
        server_rss_end = rss_mib(server.pid)
        generator_rss_end = rss_mib()
        welcomed = max(1, streams.welcomed)
        postgres = sum(v for k, v in used.items() if k.startswith("pg") and not math.isnan(v))
        out["idle"] = {
            "seconds": args.idle,
            "streams_alive_at_end": alive_at_end,
            "streams_open_at_end": streams.open,
            "streams_ended_during_run": dict(streams.ended),
            "nodes_connected_in_db": db_idle["connected"],
            "server_rss_at_start_mib": server_rss_start,
            "server_rss_before_streams_mib": server_rss_before,
            "server_rss_streams_up_mib": server_rss_with,
            "server_rss_after_idle_mib": server_rss_end,
            "server_rss_per_stream_kib": round(
                (server_rss_end - server_rss_before) * 1024 / welcomed, 1
            ),
            "server_cpu_pct_of_one_core": used["server"],
            "server_postgres_backends_cpu_pct": round(postgres, 1),
            "generator_rss_before_streams_mib": generator_rss_before,
            "generator_rss_mib": generator_rss_end,
            "generator_rss_per_stream_kib": round(
                (generator_rss_end - generator_rss_before) * 1024 / welcomed, 1
            ),
            "generator_cpu_pct_of_one_core": used["generator"],
            "machine_cpu_pct": used["machine"],
            "other_processes_cpu_pct": used["others"],
            "generator_loop_lag_ms": percentiles(lag),
            "generator_gc": gc_pauses.take(),
            "messages_received": dict(streams.received),
            "edges_messages": dict(streams.edges),
            "server_membership_heartbeat_age_s": {
                "samples": len(ages),
                "over_5s": sum(a > 5.0 for a in ages),
                "max": round(max(ages, default=0.0), 1),
            },
            "heartbeats_sent": streams.heartbeats_sent,
            "heartbeat_send_errors": dict(streams.heartbeat_errors),
            "heartbeat_gaps": {
                "count": streams.gaps,
                "over_6s": streams.gaps_over_6s,
                "over_10s": streams.gaps_over_10s,
                "max_s": round(streams.max_gap, 2),
            },
        }
        log(f"idle: {json.dumps(out['idle'])}")

        # Close every stream (the edge then records each node as disconnected).
        phase[0] = "close"
        began = time.perf_counter()
        streams.stop()
        lag_stop.set()
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            await streams.all_closed.wait()
        # Whatever is left (streams still connecting after a ramp that timed out).
        nursery.cancel_scope.cancel()
        out["close"] = {
            "close_s": round(time.perf_counter() - began, 2),
            "timed_out": scope.cancelled_caught,
            "ended": dict(streams.ended),
            "close_errors": dict(streams.close_errors),
        }
    # One more round of the edge's batched "seen" updates, then what `node list` shows.
    await trio.sleep(HEARTBEAT + 1)
    out["close"]["server_rss_after_close_mib"] = rss_mib(server.pid)
    db_after = await trio.to_thread.run_sync(database_view, files)
    out["close"]["db_6s_after_close"] = {
        "nodes_connected": db_after["connected"],
        "nodes_with_server_set": db_after["with_server"],
    }
    phase[0] = "done"


def main() -> None:
    global ADDRESS, EDGE
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--join-concurrency", type=int, default=16)
    parser.add_argument("--ramp-batch", type=int, default=200)
    parser.add_argument("--server-log", type=Path, help="keep a copy of the server's stderr")
    parser.add_argument("--address", default=ADDRESS, help="the server's loopback address")
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="do not move this process's long-lived objects out of garbage collection",
    )
    args = parser.parse_args()
    ADDRESS, EDGE = args.address, f"{args.address}:{PORT}"
    if args.nodes < 1 or args.join_concurrency < 1 or args.ramp_batch < 1 or args.idle < 0:
        parser.error("--nodes, --join-concurrency and --ramp-batch must be positive")

    out: dict[str, Any] = {
        "command": " ".join(["python -m bench.edge_load", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "server": ADDRESS,
        "source": source_version(),
        "nodes": args.nodes,
    }
    failure: BaseException | None = None
    signal.signal(signal.SIGTERM, on_terminate_signal)
    signal.signal(signal.SIGHUP, on_terminate_signal)
    with tempfile.TemporaryDirectory() as tmp, fresh_database_url() as url:
        root = Path(tmp)
        files = initialise(root, url, "bench", advertise=ADDRESS)
        server = ServerProcess.for_cluster(files, ADDRESS, workdir=root / ADDRESS)
        try:
            began = time.monotonic()
            server.start(timeout=SERVER_START_TIMEOUT)
            out["server_start_s"] = round(time.monotonic() - began, 2)
            log(f"server up on {ADDRESS} in {out['server_start_s']} s (pid {server.pid})")
            trio.run(run_load, args, files, server, out)
        except BaseException as e:
            failure = e
            out["failed"] = failure_text(e)
            log(f"failed: {out['failed']}")
        finally:
            # A second SIGTERM must not cut the clean-up short.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            progress = out.pop("progress", None)
            if failure is not None and progress is not None:
                out["progress_at_failure"] = progress()
            began = time.monotonic()
            server.kill()
            out["server_stop"] = {
                "s": round(time.monotonic() - began, 2),
                "returncode": server.process.returncode if server.process else None,
            }
            text = server.stderr()
            out["server_log"] = server_log_summary(text)
            if args.server_log:
                args.server_log.write_text(text)
    print(json.dumps(out, indent=2))
    if failure is not None and not isinstance(failure, Exception):
        raise failure


if __name__ == "__main__":
    main()
