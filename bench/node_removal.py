"""Block, unblock and purge: how fast a node is shut out, let back in and removed (issue 5).

    python -m bench.node_removal [--nodes N] [--blocks B] [--burst K] [--blocked-for S]
                                 [--purges P] [--agents A] [--seed SEED] [--server-logs DIR]

Starts a fresh test cluster (the suite's PostgreSQL, see fixtures/postgres.py) and three
real servers on 127.0.0.51, .52 and .53 (default ports), then from this one process:

1. joins N nodes through `/join` with one unlimited token and keeps a control stream up for
   each, node i on edge i % 3. Each simulated node behaves as the agent does: it sends a
   heartbeat every 5 s, and after a refusal or a lost stream tries again with the agent's
   own policy (oz0_node.reconnect.Reconnect: full jitter, never more than 5 s apart),
   asking the edge that refused it again; a purge command is checked as the agent checks
   it (signature by the pinned cluster CA, action, cluster, node ID, the connection's
   challenge, an unseen nonce) before it answers `purged` and waits for `forgotten`;
2. starts A real agents (`python -m oz0_node.main start ... --launcher L`), their edge lists
   rotated so that they spread over the servers too;
3. blocks B nodes, a third on each server, through the management API of 127.0.0.51 with
   the cluster context's operator credentials (cli.client.ApiClient, what `orchestrator-zero
   node block` runs, in an operator process of its own; one client for the run, which since
   issue 13 keeps its connections and resumes TLS sessions, see bench.block_burst):
   half one at a time (the next once the node's stream was refused or BLOCK_WAIT passed),
   half in concurrent bursts of K. For each, from just before the request, and from its
   answer, to the node's stream receiving `refused` code `blocked`;
4. keeps them blocked S seconds, so that their retries reach the 5 s cap, then unblocks them
   one after the other: from the request to the node's next `welcome`;
5. purges P other connected nodes (half one at a time, half in bursts of K): from the request
   to `forgotten`; then the A agents one at a time: from the request until the data
   directory is gone and the process has exited (status 0);
6. closes the streams, stops the agents and the servers, and prints one JSON document: per
   phase the servers' CPU and RSS and this process's loop lag; every stream that ended or
   failed unexpectedly; the `edges` messages; and what the servers logged.

Every phase has a time bound, and the run stops early if a server exits (or on SIGTERM,
still stopping everything and dropping the databases). Progress goes to stderr.
"""

from __future__ import annotations

import argparse
import base64
import binascii
import contextlib
import dataclasses
import datetime as dt
import gc
import json
import math
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import trio
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from trio_websocket import WebSocketConnection

from bench.edge_load import (
    ANSWER_TIMEOUT,
    BATCH_TIMEOUT,
    CLOSE_TIMEOUT,
    CONNECT_TIMEOUT,
    HEARTBEAT,
    SERVER_START_TIMEOUT,
    CpuWindow,
    Heartbeats,
    Live,
    Node,
    Streams,
    answer,
    create_token,
    error_name,
    failure_text,
    join_all,
    log,
    loop_lag,
    machine_info,
    on_terminate_signal,
    percentiles,
    rss_mib,
    server_log_summary,
    source_version,
    watch_server,
    watch_signals,
)
from cli.client import ApiClient
from fixtures import edge_client
from fixtures.agent import AgentProcess
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, initialise
from fixtures.edge_client import NodeKeys
from fixtures.postgres import fresh_database_url
from oz0 import pki
from oz0.context import MANAGEMENT_PORT, Context
from oz0_node.reconnect import Reconnect

ADDRESSES = ("127.0.0.51", "127.0.0.52", "127.0.0.53")
EDGES = [f"{address}:7443" for address in ADDRESSES]
# Every block, unblock and purge goes through this server's management API.
API_ADDRESS = ADDRESSES[0]
API_SERVER = f"{API_ADDRESS}:{MANAGEMENT_PORT}"

# What issue 5 asks for, and what docs/node-protocol.md promises.
BLOCK_TARGET_P99 = 0.2
BLOCK_DOCUMENTED = 2.0
UNBLOCK_TARGET_P99 = 5.0
UNBLOCK_DOCUMENTED = 10.0

# Bounds, so that a server that stops answering cannot keep the run going.
UP_TIMEOUT = 60.0
OPERATOR_START_TIMEOUT = 60.0
OPERATOR_STOP_TIMEOUT = 10.0
API_TIMEOUT = 60.0  # cli.client gives each server 15 s
AGENTS_UP_TIMEOUT = 120.0
BLOCK_WAIT = 5.0
BURST_WAIT = 15.0
UNBLOCK_WAIT = 30.0
PURGE_WAIT = 15.0
AGENT_PURGE_WAIT = 30.0
FORGOTTEN_TIMEOUT = 10.0  # as the agent (oz0_node.commands)
PHASE_LIMIT = 600.0
POLL = 0.01


# --- simulated nodes ---------------------------------------------------------------------


@dataclass(frozen=True)
class Cut:
    """A live stream the edge ended with `refused`."""

    at: float
    code: str
    edge: str


@dataclass(eq=False)
class SimNode:
    """One simulated node: its identity, its edges in the order it tries them, and what its
    streams saw, with time.monotonic() stamps."""

    index: int
    keys: NodeKeys
    ctx: ssl.SSLContext
    edges: list[str]
    edge: str | None = None  # the edge of its live stream, if it has one
    settled: bool = False  # welcomed once, or its first attempt failed
    attempts: int = 0
    attempt_began: float = 0.0
    welcomes: list[float] = field(default_factory=list)
    # When the attempt that each welcome answered began.
    welcomed_attempts: list[float] = field(default_factory=list)
    # Refused new streams: when the attempt began, when `hello` came, when it was refused.
    refused: list[tuple[float, float, float]] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    refusals: Counter[str] = field(default_factory=Counter)
    lost: Counter[str] = field(default_factory=Counter)
    failures: Counter[str] = field(default_factory=Counter)
    nonces: set[str] = field(default_factory=set)
    purge_refusals: list[str] = field(default_factory=list)
    purge_command_at: float | None = None
    purged_sent_at: float | None = None
    forgotten_at: float | None = None
    purged: bool = False

    @property
    def node_id(self) -> str:
        return self.keys.node_id


@dataclass(eq=False)
class Fleet:
    nodes: list[SimNode]
    streams: Streams
    ca_key: ec.EllipticCurvePublicKey
    cluster: str
    rng: random.Random
    welcome_edges: Counter[int] = field(default_factory=Counter)


def check_purge(
    fleet: Fleet, node: SimNode, challenge: str, message: dict[str, Any]
) -> tuple[str | None, str | None]:
    """(why the command is refused or None, its nonce): the agent's checks, against the CA
    pinned from the cluster's hash, in memory (oz0_node.purge.verify keeps them on disk)."""
    try:
        data = base64.b64decode(str(message["command"]), validate=True)
        signature = base64.b64decode(str(message["signature"]), validate=True)
    except (KeyError, binascii.Error, ValueError):
        return "malformed command", None
    try:
        fleet.ca_key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        return "signature does not verify with the cluster CA", None
    try:
        fields = json.loads(data)
    except ValueError:
        return "malformed command: not JSON", None
    if not isinstance(fields, dict):
        return "malformed command: not a JSON object", None
    nonce = fields.get("nonce")
    if not isinstance(nonce, str) or len(nonce) != 32:
        return "malformed command: nonce", None
    seen = nonce in node.nonces
    node.nonces.add(nonce)
    if fields.get("action") != "purge":
        return "action is not purge", nonce
    if fields.get("cluster") != fleet.cluster or fields.get("node_id") != node.node_id:
        return "command names another cluster or node", nonce
    if str(fields.get("challenge", "")).lower() != challenge.lower():
        return "command was signed for another connection", nonce
    if seen:
        return "nonce already seen", nonce
    return None, nonce


async def obey_purge(
    fleet: Fleet,
    node: SimNode,
    ws: WebSocketConnection,
    hello: dict[str, Any],
    message: dict[str, Any],
) -> str:
    """Answer a purge command as the agent does; "purged", or "refused" if it failed."""
    node.purge_command_at = time.monotonic()
    refusal, nonce = check_purge(fleet, node, str(hello.get("challenge", "")), message)
    if refusal is not None:
        node.purge_refusals.append(refusal)
        await edge_client.send(ws, "purge_refused", nonce=nonce, reason=refusal)
        return "refused"
    await edge_client.send(ws, "purged", nonce=nonce)
    node.purged_sent_at = time.monotonic()
    node.purged = True  # the agent deletes its files whether `forgotten` comes or not
    with trio.move_on_after(FORGOTTEN_TIMEOUT):
        try:
            while True:
                reply = await answer(ws)
                if reply.get("type") == "forgotten":
                    node.forgotten_at = time.monotonic()
                    break
        except Exception as e:
            node.failures[f"forgotten:{error_name(e)}"] += 1
    return "purged"


async def hold(
    ws: WebSocketConnection, node: SimNode, streams: Streams
) -> tuple[str, dict[str, Any], float]:
    """Read a welcomed stream until the edge ends it with `refused` or sends `purge`, or
    until stopped or silent for three heartbeats; (how it ended, the message, when)."""
    index = node.index
    live = Live(ws, trio.current_time() + HEARTBEAT)
    streams.live[index] = live
    streams.last_message[index] = trio.current_time()
    try:
        with live.scope:
            while True:
                raw = await ws.get_message()
                at = time.monotonic()
                message = streams.saw(index, str(raw), trio.current_time())
                kind = message.get("type")
                if kind in ("refused", "purge"):
                    return str(kind), message, at
    finally:
        del streams.live[index]
        streams.last_message.pop(index, None)
        streams.check_closed()
    return ("silent" if live.silent else "stopped"), {}, time.monotonic()


async def attempt(fleet: Fleet, node: SimNode, edge: str, policy: Reconnect) -> str:
    """One control stream, from connecting until it ends: "refused", "purged", "stopped",
    "lost" or "failed"."""
    node.attempts += 1
    node.attempt_began = time.monotonic()
    phase = "connecting"
    began = trio.current_time()
    with trio.CancelScope(deadline=began + CONNECT_TIMEOUT + 2 * ANSWER_TIMEOUT) as bound:
        try:
            async with edge_client.connect(edge, "/control", node.ctx) as (ws, hello):
                hello_at = time.monotonic()
                phase = "answer"
                first = await answer(ws)
                kind = first.get("type")
                if kind == "purge":
                    phase = "purge"
                    return await obey_purge(fleet, node, ws, hello, first)
                if kind == "refused":
                    node.refusals[str(first.get("code"))] += 1
                    node.refused.append((node.attempt_began, hello_at, time.monotonic()))
                    return "refused"
                if kind != "welcome":
                    node.failures[f"answer:{kind}"] += 1
                    return "failed"
                bound.deadline = math.inf
                node.welcomes.append(time.monotonic())
                node.welcomed_attempts.append(node.attempt_began)
                fleet.welcome_edges[len(first.get("edges") or [])] += 1
                node.edge, node.settled = edge, True
                policy.stream_up()
                phase = "live"
                try:
                    ended, message, at = await hold(ws, node, fleet.streams)
                finally:
                    node.edge = None
                    policy.stream_down()
                if ended == "refused":
                    node.cuts.append(Cut(at, str(message.get("code")), edge))
                    return "refused"
                if ended == "purge":
                    phase = "purge"
                    return await obey_purge(fleet, node, ws, hello, message)
                if ended == "silent":
                    node.lost["silent"] += 1
                    return "lost"
                return "stopped"
        except Exception as e:
            if phase == "live":
                node.lost[error_name(e)] += 1
                return "lost"
            node.failures[f"{phase}:{error_name(e)}"] += 1
            return "failed"
    if bound.cancelled_caught:
        node.failures[f"{phase}:timeout"] += 1
    return "failed"


def all_settled(nodes: list[SimNode]) -> bool:
    return all(n.settled for n in nodes)


async def run_node(fleet: Fleet, node: SimNode) -> None:
    """The agent's control loop (oz0_node.control.run), until purged or stopped."""
    policy = Reconnect(lambda: node.edges, rng=fleet.rng)
    while not node.purged:
        edge = await policy.next_edge()
        if fleet.streams.stopping:
            return
        outcome = await attempt(fleet, node, edge, policy)
        node.settled = True
        if outcome == "refused":
            policy.same_edge_again()
        elif outcome == "stopped":
            return


# --- the operator ------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One management API request: when it was sent and answered, and its error if any."""

    requested: float
    answered: float
    error: str | None


def operator_process(context_path: str, server: str, concurrency: str) -> None:
    """The operator's side of `Api`: each line on stdin is a request to make through
    cli.client.ApiClient (what `orchestrator-zero node ...` runs), up to CONCURRENCY at a
    time; each answer is a line on stdout with when it was sent and answered."""
    context = dataclasses.replace(Context.load(Path(context_path)), servers=(server,))
    client = ApiClient(context)
    printing = threading.Lock()

    def call(request: dict[str, Any]) -> None:
        requested = time.monotonic()
        error = None
        try:
            client.post(request["path"], request["body"])
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[:200]
        done = {"id": request["id"], "requested": requested, "answered": time.monotonic()}
        with printing:
            print(json.dumps({**done, "error": error}), flush=True)

    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(int(concurrency)) as pool:
        for line in sys.stdin:
            pool.submit(call, json.loads(line))


class Api:
    """The cluster context's operator, in a process of its own as the CLI would be, so that
    neither its requests nor its time stamps wait for this process's event loop or GIL.
    Both processes stamp with time.monotonic(), the system's one CLOCK_MONOTONIC."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.sending = trio.Lock()
        self.waiting: dict[int, tuple[trio.Event, list[Call]]] = {}
        self.last_id = 0
        self.ready = trio.Event()

    @classmethod
    @asynccontextmanager
    async def running(
        cls,
        files: ClusterFiles,
        server: str,
        concurrency: int,
        *,
        module: str = "bench.node_removal",
        extra: tuple[str, ...] = (),
    ) -> AsyncIterator[Api]:
        """The operator process: `python -m MODULE --operator CONTEXT SERVER CONCURRENCY
        EXTRA...` (MODULE's own operator_process reads the requests)."""
        command = [sys.executable, "-m", module, "--operator"]
        command += [str(files.context_path), server, str(concurrency), *extra]
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        api = cls(process)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(api._read_answers)
                with trio.fail_after(OPERATOR_START_TIMEOUT):
                    await api.ready.wait()
                yield api
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if process.stdin is not None:
                    await process.stdin.aclose()  # the operator process ends at EOF
                with trio.move_on_after(OPERATOR_STOP_TIMEOUT):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def _read_answers(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        async for chunk in self.process.stdout:
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                answer = json.loads(line)
                if answer.get("ready"):
                    self.ready.set()
                    continue
                event, slot = self.waiting.pop(int(answer["id"]))
                slot.append(Call(answer["requested"], answer["answered"], answer["error"]))
                event.set()
        raise RuntimeError(f"the operator process exited ({self.process.poll()})")

    async def post(self, path: str, body: dict[str, Any]) -> Call:
        self.last_id += 1
        event, slot = trio.Event(), list[Call]()
        self.waiting[self.last_id] = (event, slot)
        request = json.dumps({"id": self.last_id, "path": path, "body": body}) + "\n"
        assert self.process.stdin is not None
        async with self.sending:
            await self.process.stdin.send_all(request.encode())
        with trio.fail_after(API_TIMEOUT):
            await event.wait()
        return slot[0]


@dataclass(eq=False)
class Change:
    """A block, unblock or purge of one node, and when its effect was seen."""

    node: SimNode
    mode: str
    edge: str | None
    call: Call | None = None

    @property
    def same_server(self) -> bool:
        return self.edge is not None and self.edge.startswith(f"{API_ADDRESS}:")


def block_seen(change: Change) -> float | None:
    assert change.call is not None
    after = change.call.requested
    return next((c.at for c in change.node.cuts if c.at >= after and c.code == "blocked"), None)


def welcome_seen(change: Change) -> float | None:
    assert change.call is not None
    return next((t for t in change.node.welcomes if t >= change.call.requested), None)


def forgotten_seen(change: Change) -> float | None:
    return change.node.forgotten_at


Effect = Callable[[Change], float | None]


async def wait_until(done: Callable[[], bool], within: float) -> bool:
    """Whether DONE() came true within WITHIN seconds. It polls: what it waits for is
    written by other tasks or processes, which take the time stamps themselves."""
    with trio.move_on_after(within):
        while True:
            if done():
                return True
            await trio.sleep(POLL)
    return False


async def change_nodes(
    api: Api,
    changes: list[Change],
    path: str,
    body: dict[str, Any],
    effect: Effect,
    *,
    burst: int,
    wait: float,
) -> None:
    """Send the requests of CHANGES: one at a time, each waiting up to WAIT for its effect
    (burst 1), or BURST at once, each burst waiting for all its effects (burst > 1)."""

    async def one(change: Change) -> None:
        change.call = await api.post(path.format(node_id=change.node.node_id), body)

    for start in range(0, len(changes), burst):
        group = changes[start : start + burst]
        async with trio.open_nursery() as nursery:
            for change in group:
                nursery.start_soon(one, change)
        await wait_until(partial(all_done, group, effect), wait)


def all_done(changes: list[Change], effect: Effect) -> bool:
    """Whether every change that was sent failed or has had its effect."""
    return all(c.call is None or c.call.error or effect(c) is not None for c in changes)


async def send_one_after_another(
    api: Api, changes: list[Change], path: str, body: dict[str, Any]
) -> None:
    """Each request as soon as the previous one was answered, not waiting for effects."""
    for change in changes:
        change.call = await api.post(path.format(node_id=change.node.node_id), body)


def summary(changes: list[Change], effect: Effect, slow: float) -> dict[str, Any]:
    """Latencies from each request, and from its answer, to its effect; API call times."""
    from_request, from_answer, api, errors = [], [], [], Counter[str]()
    missing = []
    for change in changes:
        call = change.call
        if call is None:
            errors["not sent"] += 1
            continue
        api.append(call.answered - call.requested)
        if call.error is not None:
            errors[call.error.split(":")[0]] += 1
            continue
        seen = effect(change)
        if seen is None:
            missing.append(change.node.node_id)
            continue
        from_request.append(seen - call.requested)
        from_answer.append(seen - call.answered)
    return {
        "n": len(changes),
        "seen": len(from_request),
        "not_seen": len(missing),
        "not_seen_nodes": missing[:10],
        "api_errors": dict(errors),
        "request_to_effect_ms": percentiles(from_request),
        "answer_to_effect_ms": percentiles(from_answer),
        "api_call_ms": percentiles(api),
        f"over_{slow:g}s": sum(t > slow for t in from_request),
    }


def split_summary(changes: list[Change], effect: Effect, slow: float) -> dict[str, Any]:
    return {
        "all": summary(changes, effect, slow),
        "node_on_api_server": summary([c for c in changes if c.same_server], effect, slow),
        "node_on_other_servers": summary([c for c in changes if not c.same_server], effect, slow),
    }


def interleave(groups: Iterable[list[SimNode]]) -> list[SimNode]:
    """One from each group in turn, so that any prefix spreads over the groups."""
    lists = [list(g) for g in groups]
    out = []
    for i in range(max((len(g) for g in lists), default=0)):
        out += [g[i] for g in lists if i < len(g)]
    return out


def by_edge(
    nodes: list[SimNode], rng: random.Random, edges: Iterable[str] = EDGES
) -> list[SimNode]:
    """The live nodes, shuffled, interleaved by the edge of their stream."""
    groups: dict[str, list[SimNode]] = {edge: [] for edge in edges}
    for node in nodes:
        if node.edge is not None:
            groups[node.edge].append(node)
    for group in groups.values():
        rng.shuffle(group)
    return interleave(groups.values())


# --- measuring ---------------------------------------------------------------------------


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


def servers_up(files: ClusterFiles) -> dict[str, float]:
    """Seconds since each server's last membership heartbeat, by its address."""
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT advertise, extract(epoch FROM now() - last_heartbeat)::float FROM servers"
        ).fetchall()
    return {str(r[0]): float(r[1]) for r in rows}


async def sample_membership(files: ClusterFiles, ages: dict[str, list[float]]) -> None:
    while True:
        for address, age in (await trio.to_thread.run_sync(servers_up, files)).items():
            ages.setdefault(address, []).append(age)
        await trio.sleep(1.0)


def nodes_in_db(files: ClusterFiles, node_ids: list[str]) -> dict[str, tuple[str, str | None]]:
    """State and server of each of NODE_IDS still in the database."""
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, state, server FROM nodes WHERE id = ANY(%s)", (node_ids,)
        ).fetchall()
    return {str(r[0]): (str(r[1]), r[2]) for r in rows}


def audit_counts(files: ClusterFiles) -> dict[str, int]:
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT action, count(*) FROM audit_log WHERE action LIKE 'node.%%' GROUP BY action"
        ).fetchall()
    return {str(r[0]): int(r[1]) for r in rows}


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
    """The summary edge_load makes, counts of the lines that matter here, and the Temporal
    host's warnings and errors while the phases ran (WINDOW, UTC): starting and stopping
    three hosts one after the other makes the others complain, which is no news here."""
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


# --- real agents -------------------------------------------------------------------------


@dataclass(eq=False)
class Agent:
    process: AgentProcess
    launcher: Path
    node_id: str | None = None
    status: dict[str, Any] = field(default_factory=dict)


def start_agents(root: Path, count: int, files: ClusterFiles, token: str) -> list[Agent]:
    agents = []
    base = root / "agents"
    base.mkdir()
    for i in range(count):
        launcher = base / f"launch-{i}.sh"
        launcher.write_text("#!/bin/sh\nexec oz0-node start --data-dir DIR\n")
        edges = EDGES[i % 3 :] + EDGES[: i % 3]
        process = AgentProcess.joining(
            base / f"node-{i}", edges, files.ca_hash, token=token, labels={"bench": f"agent-{i}"}
        )
        process.args += ["--launcher", str(launcher)]
        agents.append(Agent(process.start(), launcher))
    return agents


def read_status(agent: Agent) -> dict[str, Any]:
    try:
        value = json.loads((agent.process.data_dir / "status.json").read_text())
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


async def purge_agent(api: Api, agent: Agent) -> dict[str, Any]:
    """Purge one connected agent: from the request until its directory is gone and it exited."""
    assert agent.node_id is not None and agent.process.process is not None
    process, data_dir = agent.process.process, agent.process.data_dir
    call = await api.post(f"/api/v1/nodes/{agent.node_id}/purge", {})
    gone = exited = None
    with trio.move_on_after(AGENT_PURGE_WAIT):
        while gone is None or exited is None:
            now = time.monotonic()
            if gone is None and not data_dir.exists():
                gone = now
            if exited is None and process.poll() is not None:
                exited = now
            await trio.sleep(POLL)
    result: dict[str, Any] = {
        "node_id": agent.node_id,
        "server": agent.status.get("server"),
        "api_error": call.error,
        "api_call_ms": round((call.answered - call.requested) * 1000, 1),
        "request_to_dir_gone_ms": round((gone - call.requested) * 1000, 1) if gone else None,
        "request_to_exit_ms": round((exited - call.requested) * 1000, 1) if exited else None,
        "returncode": process.poll(),
        "launcher_gone": not agent.launcher.exists(),
    }
    if process.poll() != 0:
        result["log_tail"] = agent.process.log()[-1500:]
    return result


# --- the run -----------------------------------------------------------------------------


def lost_and_failed(nodes: Iterable[SimNode]) -> dict[str, Any]:
    lost: Counter[str] = Counter()
    failed: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    for node in nodes:
        lost.update(node.lost)
        failed.update(node.failures)
        refusals.update(node.refusals)
    return {
        "live_streams_lost": dict(lost),
        "attempts_failed": dict(failed),
        "refused_attempts": dict(refusals),
    }


async def run_bench(
    args: argparse.Namespace,
    files: ClusterFiles,
    servers: dict[str, ServerProcess],
    agents: list[Agent],
    root: Path,
    out: dict[str, Any],
) -> None:
    run = Run(args, files, servers, agents, root, out)
    async with trio.open_nursery() as watchdog:
        for server in servers.values():
            watchdog.start_soon(watch_server, server, run.phase)
        watchdog.start_soon(watch_signals)
        watchdog.start_soon(loop_lag, run.meter.lag, trio.Event())
        await run.measure()
        watchdog.cancel_scope.cancel()


@dataclass(eq=False)
class Run:
    """One run: each phase a method that adds its section to OUT["phases"]."""

    args: argparse.Namespace
    files: ClusterFiles
    servers: dict[str, ServerProcess]
    agents: list[Agent]
    root: Path
    out: dict[str, Any]
    phase: list[str] = field(default_factory=lambda: ["setup"])
    phases: dict[str, Any] = field(default_factory=dict)
    # The servers' edges, in the order node 0 tries them (bench.database_restart has others).
    edges: list[str] = field(default_factory=lambda: list(EDGES))
    meter: Meter = field(init=False)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.meter = Meter(self.servers)
        self.rng = random.Random(self.args.seed)
        self.out["phases"] = self.phases

    def begin(self, name: str) -> None:
        self.phase[0] = name
        self.meter.start()

    def end(self, name: str, section: dict[str, Any]) -> None:
        self.phases[name] = {**section, **self.meter.stop()}
        log(f"{name}: {json.dumps(self.phases[name])}")

    async def measure(self) -> None:
        self.phase[0] = "servers up"
        began = time.monotonic()
        if not await wait_until_servers(self.files, len(self.servers)):
            raise RuntimeError(f"not all {len(self.servers)} servers were up within {UP_TIMEOUT} s")
        # One more round of every edge's directory, so that welcomes list all three.
        await trio.sleep(2.5)
        self.out["servers_up_s"] = round(time.monotonic() - began, 1)

        ca_pem, ca_hash = await edge_client.fetch_ca(EDGES[0])
        ca_cert = pki.cert_from_pem(ca_pem)
        if ca_hash != self.files.ca_hash or pki.ca_hash(ca_cert) != ca_hash:
            raise RuntimeError(f"edge presents CA {ca_hash}, cluster has {self.files.ca_hash}")
        ca_key = ca_cert.public_key()
        assert isinstance(ca_key, ec.EllipticCurvePublicKey)
        token = await trio.to_thread.run_sync(create_token, self.files, "bench.node_removal")
        fleet = Fleet([], Streams(), ca_key, self.files.name, self.rng)
        self.out["phases_utc"] = [utc_stamp(), None]
        await self.join(fleet, token, ca_pem)
        async with (
            Api.running(self.files, API_SERVER, max(self.args.burst, 1)) as api,
            trio.open_nursery() as nursery,
        ):
            self.meter.others["operator"] = api.process.pid
            nursery.start_soon(Heartbeats(fleet.streams, nursery).run)
            ages: dict[str, list[float]] = {}
            nursery.start_soon(sample_membership, self.files, ages)
            await self.ramp(fleet, nursery)
            fleet.streams.measuring = True
            if self.args.agents:
                await self.start_agents(token)

            self.begin("baseline")
            await trio.sleep(self.args.baseline)
            self.end("baseline", {"open_streams": fleet.streams.open})

            chosen = by_edge(fleet.nodes, self.rng)
            blocks = await self.block(api, chosen[: self.args.blocks])
            await self.unblock(api, blocks)
            to_purge = chosen[self.args.blocks : self.args.blocks + self.args.purges]
            await self.purge(api, to_purge)
            if self.agents:
                await self.purge_agents(api)

            self.phase[0] = "end"
            self.out["phases_utc"][1] = utc_stamp()
            self.out["end"] = await self.final_state(fleet, ages)
            log(f"end: {json.dumps(self.out['end'])}")
            self.phase[0] = "close"
            fleet.streams.stop()
            with trio.move_on_after(CLOSE_TIMEOUT):
                await fleet.streams.all_closed.wait()
            nursery.cancel_scope.cancel()
        self.out["targets"] = targets(self.phases)
        self.phase[0] = "done"

    async def join(self, fleet: Fleet, token: str, ca_pem: bytes) -> None:
        """N nodes join through /join (node i through edge i % 3); keys made beforehand."""
        joining = []
        for _ in range(self.args.nodes):
            keys = NodeKeys.new()
            keys.ca_pem = ca_pem
            joining.append(Node(keys, keys.csr_pem()))
        self.begin("joins")
        time_limit = max(300.0, self.args.nodes * 0.2)
        results, wall, timed_out = await join_all(
            joining, token, ca_pem, 16, time_limit=time_limit, edges=self.edges
        )
        self.end(
            "joins",
            {
                "joined": len(results.joined),
                "errors": dict(results.errors),
                "timed_out": timed_out,
                "joins_per_s": round(len(results.joined) / wall, 1) if wall > 0 else None,
            },
        )
        if len(results.joined) < self.args.nodes:
            raise RuntimeError(f"only {len(results.joined)} of {self.args.nodes} nodes joined")
        for index, joined in enumerate(results.joined):
            assert joined.keys.node_id
            home = index % len(self.edges)
            ctx = edge_client.verified_context(ca_pem, joined.keys)
            edges = self.edges[home:] + self.edges[:home]
            fleet.nodes.append(SimNode(index, joined.keys, ctx, edges))
        gc.collect()
        gc.freeze()  # keys and contexts live until the end: keep full collections off them

    async def ramp(self, fleet: Fleet, nursery: trio.Nursery) -> None:
        """Start the nodes 200 at a time, each batch once the last one is settled."""
        self.begin("ramp")
        for start in range(0, len(fleet.nodes), 200):
            batch = fleet.nodes[start : start + 200]
            for node in batch:
                nursery.start_soon(run_node, fleet, node)
            if not await wait_until(partial(all_settled, batch), BATCH_TIMEOUT):
                raise RuntimeError(f"streams {start}.. not settled in {BATCH_TIMEOUT} s")
            gc.freeze()
        self.end(
            "ramp",
            {
                "welcomed": sum(n.edge is not None for n in fleet.nodes),
                "per_edge": dict(Counter(n.edge for n in fleet.nodes if n.edge)),
                **lost_and_failed(fleet.nodes),
            },
        )

    async def start_agents(self, token: str) -> None:
        self.begin("agents_start")
        agents = self.agents
        agents.extend(start_agents(self.root, self.args.agents, self.files, token))
        up = await wait_until(
            lambda: all(read_status(a).get("connected") for a in agents), AGENTS_UP_TIMEOUT
        )
        for agent in agents:
            agent.status = read_status(agent)
            agent.node_id = agent.status.get("node_id")
        servers = Counter(str(a.status.get("server")) for a in agents)
        self.end("agents_start", {"all_connected": up, "servers": dict(servers)})

    async def block(self, api: Api, nodes: list[SimNode]) -> list[Change]:
        """Block half of NODES one at a time, the other half in bursts."""
        half = len(nodes) // 2
        burst = self.args.burst
        blocks = [Change(n, "one at a time", n.edge) for n in nodes[:half]]
        blocks += [Change(n, f"bursts of {burst}", n.edge) for n in nodes[half:]]
        path, body = "/api/v1/nodes/{node_id}/block", {"reason": "bench.node_removal"}
        for name, group, size, wait in (
            ("block_one_at_a_time", blocks[:half], 1, BLOCK_WAIT),
            ("block_bursts", blocks[half:], burst, BURST_WAIT),
        ):
            self.begin(name)
            with trio.move_on_after(PHASE_LIMIT) as bounded:
                await change_nodes(api, group, path, body, block_seen, burst=size, wait=wait)
            section = split_summary(group, block_seen, BLOCK_DOCUMENTED)
            self.end(name, {**section, "timed_out": bounded.cancelled_caught})

        # Blocked long enough for the nodes' retries to reach the 5 s cap.
        self.begin("blocked")
        refused_before = sum(c.node.refusals["blocked"] for c in blocks)
        began = time.monotonic()
        await trio.sleep(self.args.blocked_for)
        refused_in = [times for c in blocks for times in c.node.refused if times[0] >= began]
        retries = sum(c.node.refusals["blocked"] for c in blocks) - refused_before
        per_node = retries / len(blocks) / self.args.blocked_for if blocks else math.nan
        welcomed = sum(any(t > c.call.requested for t in c.node.welcomes) for c in blocks if c.call)
        self.end(
            "blocked",
            {
                "nodes": len(blocks),
                "seconds": self.args.blocked_for,
                "refused_attempts": retries,
                "attempts_per_node_per_s": round(per_node, 3),
                "refused_attempt_ms": {
                    "connect_to_hello": percentiles([h - start for start, h, _ in refused_in]),
                    "hello_to_refused": percentiles([at - h for _, h, at in refused_in]),
                    "whole": percentiles([at - start for start, _, at in refused_in]),
                },
                "welcomed_while_blocked": welcomed,
            },
        )
        return blocks

    async def unblock(self, api: Api, blocks: list[Change]) -> None:
        """Unblock every blocked node, one request after the other; wait for the welcomes."""
        self.begin("unblock")
        unblocks = [Change(c.node, "one after another", c.edge) for c in blocks]
        with trio.move_on_after(PHASE_LIMIT) as bounded:
            await send_one_after_another(api, unblocks, "/api/v1/nodes/{node_id}/unblock", {})
            await wait_until(partial(all_done, unblocks, welcome_seen), UNBLOCK_WAIT)
        later = [
            w - c.call.requested for c in unblocks if c.call and (w := welcome_seen(c)) is not None
        ]
        self.end(
            "unblock",
            {
                **summary(unblocks, welcome_seen, UNBLOCK_TARGET_P99),
                "breakdown_ms": unblock_breakdown(unblocks),
                f"over_{UNBLOCK_DOCUMENTED:g}s": sum(t > UNBLOCK_DOCUMENTED for t in later),
                "timed_out": bounded.cancelled_caught,
            },
        )

    async def purge(self, api: Api, nodes: list[SimNode]) -> None:
        """Purge half of NODES one at a time, the other half in bursts."""
        self.begin("purge")
        half = len(nodes) // 2
        burst = self.args.burst
        purges = [Change(n, "one at a time", n.edge) for n in nodes[:half]]
        purges += [Change(n, f"bursts of {burst}", n.edge) for n in nodes[half:]]
        path = "/api/v1/nodes/{node_id}/purge"
        with trio.move_on_after(PHASE_LIMIT) as bounded:
            for group, size in ((purges[:half], 1), (purges[half:], burst)):
                await change_nodes(
                    api, group, path, {}, forgotten_seen, burst=size, wait=PURGE_WAIT
                )
        left = await trio.to_thread.run_sync(
            nodes_in_db, self.files, [c.node.node_id for c in purges]
        )
        self.end(
            "purge",
            {
                "one_at_a_time": split_summary(purges[:half], forgotten_seen, BLOCK_DOCUMENTED),
                "bursts": split_summary(purges[half:], forgotten_seen, BLOCK_DOCUMENTED),
                "breakdown_ms": purge_breakdown(purges),
                "purge_refusals": [r for c in purges for r in c.node.purge_refusals][:10],
                "purged_nodes_still_in_db": len(left),
                "timed_out": bounded.cancelled_caught,
            },
        )

    async def purge_agents(self, api: Api) -> None:
        """Purge the real agents one at a time, each once the previous one is gone."""
        self.begin("purge_agents")
        done: list[dict[str, Any]] = []
        with trio.move_on_after(PHASE_LIMIT) as bounded:
            for agent in self.agents:
                if agent.node_id is None:
                    done.append({"error": "never connected", "log": agent.process.log()[-800:]})
                    continue
                done.append(await purge_agent(api, agent))

        def seconds(key: str) -> list[float]:
            return [d[key] / 1000 for d in done if d.get(key) is not None]

        self.end(
            "purge_agents",
            {
                "agents": len(self.agents),
                "exited_0": sum(d.get("returncode") == 0 for d in done),
                "dirs_gone": len(seconds("request_to_dir_gone_ms")),
                "launchers_gone": sum(bool(d.get("launcher_gone")) for d in done),
                "request_to_dir_gone_ms": percentiles(seconds("request_to_dir_gone_ms")),
                "request_to_exit_ms": percentiles(seconds("request_to_exit_ms")),
                "each": done,
                "timed_out": bounded.cancelled_caught,
            },
        )

    async def final_state(self, fleet: Fleet, ages: dict[str, list[float]]) -> dict[str, Any]:
        """What is left: streams, the database's view, everything that went wrong."""
        expected = [n for n in fleet.nodes if not n.purged]
        db_state = await trio.to_thread.run_sync(
            nodes_in_db, self.files, [n.node_id for n in fleet.nodes]
        )
        streams = fleet.streams
        return {
            "nodes_expected_live": len(expected),
            "streams_open": streams.open,
            "streams_alive": streams.alive(),
            "nodes_without_stream": [n.node_id for n in expected if n.edge is None][:10],
            "db_states": dict(Counter(state for state, _ in db_state.values())),
            "db_connected": sum(server is not None for _, server in db_state.values()),
            **lost_and_failed(fleet.nodes),
            "welcome_edge_counts": dict(fleet.welcome_edges),
            "edges_messages": dict(streams.edges),
            "messages_received": dict(streams.received),
            "heartbeats_sent": streams.heartbeats_sent,
            "heartbeat_send_errors": dict(streams.heartbeat_errors),
            "heartbeat_gaps": {
                "count": streams.gaps,
                "over_6s": streams.gaps_over_6s,
                "over_10s": streams.gaps_over_10s,
                "max_s": round(streams.max_gap, 2),
            },
            "server_membership_age_s": {
                address: {"max": round(max(a), 1), "over_5s": sum(x > 5 for x in a)}
                for address, a in ages.items()
            },
            "audit": await trio.to_thread.run_sync(audit_counts, self.files),
        }


def unblock_breakdown(unblocks: list[Change]) -> dict[str, Any]:
    """Where an unblock's time goes: waiting for the node's next attempt (its backoff, at
    most 5 s once it is at the cap), then that attempt connecting until `welcome`; and how
    many nodes had an attempt refused that ended after the request was sent."""
    waiting, connecting, refused_after = [], [], 0
    for change in unblocks:
        node, call = change.node, change.call
        if call is None or call.error is not None:
            continue
        for at, began in zip(node.welcomes, node.welcomed_attempts, strict=True):
            if at >= call.requested:
                waiting.append(max(0.0, began - call.requested))
                connecting.append(at - began)
                break
        refused_after += any(at >= call.requested for _, _, at in node.refused)
    return {
        "request_to_attempt": percentiles(waiting),
        "attempt_to_welcome": percentiles(connecting),
        "nodes_refused_after_request": refused_after,
    }


def purge_breakdown(purges: list[Change]) -> dict[str, Any]:
    """Where a purge's time goes: to the command arriving (notification, signing), to our
    `purged` (checking it here), and to `forgotten` (the edge deleting the node)."""
    command, answered, forgotten = [], [], []
    for change in purges:
        node, call = change.node, change.call
        if call is None or node.purge_command_at is None:
            continue
        command.append(node.purge_command_at - call.requested)
        if node.purged_sent_at is not None:
            answered.append(node.purged_sent_at - node.purge_command_at)
            if node.forgotten_at is not None:
                forgotten.append(node.forgotten_at - node.purged_sent_at)
    return {
        "request_to_command": percentiles(command),
        "command_to_purged_answer": percentiles(answered),
        "purged_answer_to_forgotten": percentiles(forgotten),
    }


def targets(phases: dict[str, Any]) -> dict[str, Any]:
    def p99(section: dict[str, Any]) -> float | None:
        value = section["request_to_effect_ms"]["p99"]
        return float(value) if value is not None else None

    found: dict[str, Any] = {}
    for name in ("block_one_at_a_time", "block_bursts"):
        if name in phases:
            value = p99(phases[name]["all"])
            found[f"{name}_p99_ms"] = value
            found[f"{name}_under_200ms"] = value is not None and value < BLOCK_TARGET_P99 * 1000
    if "unblock" in phases:
        value = p99(phases["unblock"])
        found["unblock_p99_ms"] = value
        found["unblock_under_5s"] = value is not None and value < UNBLOCK_TARGET_P99 * 1000
    return found


async def wait_until_servers(files: ClusterFiles, count: int) -> bool:
    async def up() -> int:
        ages = await trio.to_thread.run_sync(servers_up, files)
        return sum(age < 5.0 for age in ages.values())

    with trio.move_on_after(UP_TIMEOUT):
        while True:
            if await up() >= count:
                return True
            await trio.sleep(0.2)
    return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=300, help="nodes blocked and unblocked")
    parser.add_argument("--burst", type=int, default=50, help="concurrent requests per burst")
    parser.add_argument("--blocked-for", type=float, default=20.0, help="seconds before unblock")
    parser.add_argument("--purges", type=int, default=100, help="simulated nodes purged")
    parser.add_argument("--agents", type=int, default=10, help="real agents purged")
    parser.add_argument("--baseline", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--server-logs", type=Path, help="keep the servers' stderr in DIR")
    parser.add_argument("--operator", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator:
        operator_process(*args.operator)
        return
    if args.nodes < 3 or args.burst < 1 or args.blocks + args.purges > args.nodes:
        parser.error("need --nodes >= 3, --burst >= 1 and --blocks + --purges <= --nodes")

    out: dict[str, Any] = {
        "command": " ".join(["python -m bench.node_removal", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "servers": list(ADDRESSES),
        "api_server": API_SERVER,
        # The servers, the CLI's client, and the agent (real, and the reconnect policy).
        "source": source_version(("oz0", "cli", "oz0_node")),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    failure: BaseException | None = None
    signal.signal(signal.SIGTERM, on_terminate_signal)
    signal.signal(signal.SIGHUP, on_terminate_signal)
    agents: list[Agent] = []
    with tempfile.TemporaryDirectory() as tmp, fresh_database_url() as url:
        root = Path(tmp)
        files = initialise(root, url, "bench", advertise=ADDRESSES[0])
        servers = {a: ServerProcess.for_cluster(files, a, workdir=root / a) for a in ADDRESSES}
        try:
            out["server_start_s"] = {}
            for address, server in servers.items():
                began = time.monotonic()
                server.start(timeout=SERVER_START_TIMEOUT)
                out["server_start_s"][address] = round(time.monotonic() - began, 2)
                log(f"server up on {address} in {out['server_start_s'][address]} s")
            trio.run(run_bench, args, files, servers, agents, root, out)
        except BaseException as e:
            failure = e
            out["failed"] = failure_text(e)
            log(f"failed: {out['failed']}")
        finally:
            # A second SIGTERM must not cut the clean-up short.
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            for agent in agents:
                agent.process.stop()
            out["server_logs"] = {}
            for address, server in servers.items():
                with contextlib.suppress(Exception):
                    server.kill()
                text = server.stderr()
                out["server_logs"][address] = {
                    "returncode": server.process.returncode if server.process else None,
                    **server_log(text, out.get("phases_utc") or [None, None]),
                }
                if args.server_logs:
                    args.server_logs.mkdir(parents=True, exist_ok=True)
                    (args.server_logs / f"{address}.log").write_text(text)
    print(json.dumps(out, indent=2))
    if failure is not None and not isinstance(failure, Exception):
        raise failure


if __name__ == "__main__":
    main()
