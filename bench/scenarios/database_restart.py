"""Database restarts under load: do 1,000 nodes' control streams outlive them, and how soon
does a block take effect again (issue 9)?

    python -m bench.database_restart [--nodes N] [--restarts R] [--down D] [--no-terminate]
                                     [--settle S] [--seed SEED] [--server-logs DIR]

The runner (bench/runner.py) starts a PostgreSQL of its own on 127.0.0.1:5441
(fixtures/private_postgres.py, so that it can be restarted), initialises a cluster in it
and starts three real servers on 127.0.0.103, .104 and .105 (default ports). Then, from
this one process:

1. joins N simulated nodes and keeps a control stream up for each, node i on edge i % 3,
   as bench/fleet.py runs them (real TLS with each node's certificate, heartbeats every 5 s,
   the agent's reconnect policy after a refusal or a lost stream);
2. blocks one node with the database up, for reference (the same request and wait as in
   the rounds);
3. R rounds of a restart (`pg_ctl stop -m fast`, every session gets AdminShutdown; after
   D seconds, 0 by default, `pg_ctl start`), then one round of `pg_terminate_backend` of
   every client backend (what a failover does to the servers' connections; --no-terminate
   leaves it out). In each round:
   - from the moment the database accepts connections again, blocks one connected node
     through 127.0.0.103's management API (cli.client.ApiClient with the cluster context's
     operator, in an operator process of its own, bench/operator.py), again and again
     until the API accepts it, and waits for that node's stream to receive `refused`
     `blocked`: both times are measured from the database being back;
   - until every other node is heard from again in the database (`last_seen` after the
     database was back), and for at least S seconds, so that a stream that died silently
     shows (the nodes give up on a silent stream after three heartbeats, 15 s);
   - counts the other nodes' live streams that ended (goal 0) and the nodes welcomed again;
   - the servers' and their Temporal hosts' CPU and RSS over the round (and their peaks,
     sampled every 0.5 s), and what the servers logged during it;
4. closes the streams.

Every wait has a bound.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
import trio

from bench.fleet import FleetRun, by_edge
from bench.measure import cpu_seconds, rss_mib, utc_stamp
from bench.operator import Api, Call
from bench.runner import POLL, Bench, Scenario, log, wait_until
from fixtures.cluster import ClusterFiles
from fixtures.edge_client import Fleet, SimNode, lost_and_failed
from fixtures.private_postgres import PrivatePostgres
from oz0.context import MANAGEMENT_PORT
from oz0_common.addresses import EDGE_PORT

ADDRESSES = ("127.0.0.103", "127.0.0.104", "127.0.0.105")
EDGES = [f"{address}:{EDGE_PORT}" for address in ADDRESSES]
API_SERVER = f"{ADDRESSES[0]}:{MANAGEMENT_PORT}"
POSTGRES_PORT = 5441

# Bounds, so that servers that never recover cannot keep the run going.
BLOCK_ACCEPT_TIMEOUT = 120.0
BLOCK_EFFECT_TIMEOUT = 60.0
HEARD_FROM_TIMEOUT = 120.0
RETRY_BLOCK_EVERY = 0.2
SAMPLE_EVERY = 0.5
PROBLEM_LINES = 12


# --- what the database and the servers say -------------------------------------------------


def database_now(files: ClusterFiles) -> dt.datetime:
    with psycopg.connect(files.main_db, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT now()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def heard_from_since(files: ClusterFiles, node_ids: list[str], since: dt.datetime) -> int:
    """How many of NODE_IDS a server recorded as connected and heard from after SINCE."""
    with psycopg.connect(files.main_db, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(
            "SELECT count(*) FROM nodes WHERE id = ANY(%s) AND server IS NOT NULL"
            " AND last_seen > %s",
            (node_ids, since),
        ).fetchone()
    return int(row[0]) if row else 0


def server_backends(postgres: PrivatePostgres) -> int:
    with postgres.connection() as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            " AND pid <> pg_backend_pid()"
        ).fetchone()
    return int(row[0]) if row else 0


_LEVEL = re.compile(r"^\S+ \S+ (WARNING|ERROR|CRITICAL) ")
_TEMPORAL = re.compile(
    r"^(?:\S+ \S+ \w+ oz0\.temporal\.host: )?"  # the server's logging, around Temporal's JSON
    r'\{"level":"(warn|error|dpanic|panic|fatal)".*?"msg":"([^"]*)"'
)


def log_slice(text: str) -> dict[str, Any]:
    """What a server logged in one round: warnings and errors (the lines themselves, up to
    PROBLEM_LINES), tracebacks, and its Temporal host's warnings and errors by message."""
    lines = text.splitlines()
    levels: Counter[str] = Counter()
    problems: list[str] = []
    for line in lines:
        if m := _LEVEL.match(line):
            levels[m[1]] += 1
            if len(problems) < PROBLEM_LINES:
                problems.append(line[:300])
    temporal = Counter(f"{m[1]}: {m[2][:80]}" for line in lines if (m := _TEMPORAL.match(line)))
    return {
        "lines": len(lines),
        "warning": levels["WARNING"],
        "error": levels["ERROR"] + levels["CRITICAL"],
        "tracebacks": text.count("Traceback"),
        "problem_lines": problems,
        "temporal_host": dict(temporal.most_common(10)),
    }


# --- sampling the servers ------------------------------------------------------------------


@dataclass
class Peaks:
    """Each process's highest RSS and highest CPU over one SAMPLE_EVERY, while sampling."""

    pids: dict[str, int]
    rss: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)

    async def run(self) -> None:
        last = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        at = time.monotonic()
        while True:
            await trio.sleep(SAMPLE_EVERY)
            now = time.monotonic()
            for name, pid in self.pids.items():
                used = cpu_seconds(pid)
                pct = 100 * (used - last[name]) / (now - at)
                last[name] = used
                if not math.isnan(pct):
                    self.cpu[name] = max(self.cpu.get(name, 0.0), round(pct, 1))
                rss = rss_mib(pid)
                if not math.isnan(rss):
                    self.rss[name] = max(self.rss.get(name, 0.0), rss)
            at = now


# --- one round -----------------------------------------------------------------------------


@dataclass
class BlockAfter:
    """Blocking one node from the moment the database is back until the API accepts it."""

    node: SimNode
    edge: str | None
    calls: list[Call] = field(default_factory=list)
    closed_at: float | None = None

    @property
    def accepted(self) -> Call | None:
        return next((c for c in self.calls if c.error is None), None)

    def errors(self) -> dict[str, int]:
        return dict(Counter(str(c.error).split(":")[0] for c in self.calls if c.error))

    def summary(self, since: float) -> dict[str, Any]:
        """Its times from SINCE (the database back), and from the accepted request."""
        accepted, closed = self.accepted, self.closed_at
        return {
            "node_edge": self.edge,
            "api_attempts": len(self.calls),
            "api_errors_before_accepted": self.errors(),
            "first_api_error": next((c.error for c in self.calls if c.error), None),
            "accepted_call_ms": ms(accepted.answered - accepted.requested if accepted else None),
            "back_to_accepted_ms": ms(accepted.answered - since if accepted else None),
            "back_to_stream_closed_ms": ms(closed - since if closed is not None else None),
            "accepted_request_to_closed_ms": ms(
                closed - accepted.requested if accepted and closed is not None else None
            ),
        }


@dataclass
class Before:
    """What each node's streams had seen when a round began."""

    welcomes: dict[int, int]
    cuts: dict[int, int]
    lost: dict[int, int]

    @classmethod
    def take(cls, nodes: list[SimNode]) -> Before:
        return cls(
            {n.index: len(n.welcomes) for n in nodes},
            {n.index: len(n.cuts) for n in nodes},
            {n.index: sum(n.lost.values()) for n in nodes},
        )


def ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


@dataclass(eq=False)
class RestartRun(FleetRun):
    """bench/fleet.py's run (joins, ramp, meter), with rounds of database outages."""

    blocked: set[int] = field(default_factory=set)

    @property
    def postgres(self) -> PrivatePostgres:
        assert self.bench.postgres is not None
        return self.bench.postgres

    async def measure(self) -> None:
        fleet, token, ca_pem = await self.fleet()
        self.out["phases_utc"] = [utc_stamp(), None]
        await self.join(fleet, token, ca_pem)
        async with Api.running(self.files, API_SERVER, 1) as api, trio.open_nursery() as nursery:
            self.meter.others["operator"] = api.process.pid
            for address, server in self.servers.items():
                for pid in server.started_children:
                    self.meter.others[f"host {address}"] = pid
            await self.ramp(fleet, nursery)
            self.begin("baseline")
            await trio.sleep(self.args.baseline)
            backends = await trio.to_thread.run_sync(server_backends, self.postgres)
            # The same block with no outage: what the rounds' block times compare with.
            reference = self.choose(fleet, 0)
            began = time.monotonic()
            await self.block_after(api, reference, began)
            self.end(
                "baseline",
                {
                    "open_streams": fleet.streams.open,
                    "db_backends": backends,
                    "block_without_outage": reference.summary(began),
                },
            )

            kinds = ["restart"] * self.args.restarts + ["terminate"] * self.args.terminate
            self.out["rounds"] = []
            for number, kind in enumerate(kinds, 1):
                self.out["rounds"].append(await self.round(api, fleet, number, kind))

            self.bench.phase[0] = "end"
            self.out["phases_utc"][1] = utc_stamp()
            live = [n for n in fleet.nodes if n.index not in self.blocked]
            self.out["end"] = {
                "nodes_expected_live": len(live),
                "streams_open": fleet.streams.open,
                "streams_alive": fleet.streams.alive(),
                "nodes_without_stream": sum(n.edge is None for n in live),
                "whole_run": lost_and_failed(fleet.nodes),
                "heartbeat_gaps": fleet.streams.gap_summary(),
                "edges_messages": dict(fleet.streams.edges),
            }
            log(f"end: {json.dumps(self.out['end'])}")
            await self.close(fleet, nursery)
        self.bench.phase[0] = "done"

    def choose(self, fleet: Fleet, turn: int) -> BlockAfter:
        """A connected node to block, on each edge in turn (the API's server first)."""
        candidates = by_edge(fleet.nodes, self.rng, self.edges)
        on_edge = [n for n in candidates if n.edge == self.edges[turn % len(self.edges)]]
        target = (on_edge or candidates)[0]
        self.blocked.add(target.index)
        return BlockAfter(target, target.edge)

    async def round(self, api: Api, fleet: Fleet, number: int, kind: str) -> dict[str, Any]:
        """One outage, and everything measured about it."""
        postgres = self.postgres
        name = f"round {number}: {kind}"
        block = self.choose(fleet, number - 1)
        others = [n for n in fleet.nodes if n.index not in self.blocked]
        log_start = {a: len(s.stderr()) for a, s in self.servers.items()}
        before = Before.take(fleet.nodes)
        peaks = Peaks({k: v for k, v in self.meter.pids().items() if isinstance(v, int)})

        self.begin(name)
        async with trio.open_nursery() as sampling:
            sampling.start_soon(peaks.run)
            outage: dict[str, Any] = {"kind": kind}
            began = time.monotonic()
            if kind == "restart":
                await trio.to_thread.run_sync(postgres.stop)
                stopped = time.monotonic()
                await trio.sleep(self.args.down)
                starting = time.monotonic()
                await trio.to_thread.run_sync(postgres.start)
                outage["stop_s"] = round(stopped - began, 2)
                outage["start_s"] = round(time.monotonic() - starting, 2)
            else:
                outage["backends_terminated"] = await trio.to_thread.run_sync(
                    postgres.terminate_backends
                )
            back = time.monotonic()
            outage["down_s"] = round(back - began, 2)
            log(f"{name}: database back after {outage['down_s']} s")
            back_db = await trio.to_thread.run_sync(database_now, self.files)
            heard: dict[str, Any] = {}
            async with trio.open_nursery() as waits:
                waits.start_soon(self.block_after, api, block, back)
                waits.start_soon(self.all_heard_from, others, back, back_db, heard)
            # Long enough for a stream that died silently to be given up by its node.
            await trio.sleep(max(0.0, self.args.settle - (time.monotonic() - back)))
            sampling.cancel_scope.cancel()

        servers_running = {
            a: s.process is not None and s.process.poll() is None for a, s in self.servers.items()
        }
        dropped = Counter[str]()
        reconnected = []
        for node in others:
            for cut in node.cuts[before.cuts[node.index] :]:
                dropped[f"refused:{cut.code}"] += 1
            lost = sum(node.lost.values()) - before.lost[node.index]
            if lost:
                dropped["lost"] += lost
            if len(node.welcomes) > before.welcomes[node.index]:
                reconnected.append(node)
        result = {
            **outage,
            "block": block.summary(back),
            "others": {
                "nodes": len(others),
                "streams_dropped": sum(dropped.values()),
                "dropped_by_how": dict(dropped),
                "nodes_welcomed_again": len(reconnected),
                "with_stream_at_end": sum(n.edge is not None for n in others),
                **heard,
            },
            "servers_running": servers_running,
            "server_peaks": {"rss_mib": peaks.rss, "cpu_pct_of_one_core": peaks.cpu},
            "server_logs": {
                a: log_slice(s.stderr()[log_start[a] :]) for a, s in self.servers.items()
            },
        }
        self.end(name, result)
        section: dict[str, Any] = self.phases[name]
        return section

    async def block_after(self, api: Api, block: BlockAfter, back: float) -> None:
        """Block BLOCK's node until the API accepts it, then wait for its stream to end."""
        path = f"/api/v1/nodes/{block.node.node_id}/block"
        with trio.move_on_after(BLOCK_ACCEPT_TIMEOUT):
            while True:
                call = await api.post(path, {"reason": "bench.database_restart"})
                block.calls.append(call)
                if call.error is None:
                    break
                await trio.sleep(RETRY_BLOCK_EVERY)
        if block.accepted is None:
            return
        first = block.calls[0].requested

        def closed() -> bool:
            return any(c.at >= first and c.code == "blocked" for c in block.node.cuts)

        if await wait_until(closed, BLOCK_EFFECT_TIMEOUT):
            block.closed_at = next(
                c.at for c in block.node.cuts if c.at >= first and c.code == "blocked"
            )

    async def all_heard_from(
        self,
        nodes: list[SimNode],
        back: float,
        back_db: dt.datetime,
        heard: dict[str, Any],
    ) -> None:
        """Seconds from the database being back until the servers recorded every one of
        NODES as connected and heard from since (what `node list` shows)."""
        ids = [n.node_id for n in nodes]
        count = partial(heard_from_since, self.files, ids, back_db)
        seen = 0
        with trio.move_on_after(HEARD_FROM_TIMEOUT):
            while True:
                try:
                    seen = await trio.to_thread.run_sync(count)
                except psycopg.OperationalError:
                    seen = 0
                if seen >= len(ids):
                    heard["all_heard_from_s"] = round(time.monotonic() - back, 2)
                    break
                await trio.sleep(max(POLL, 0.5))
        heard["heard_from"] = seen
        if "all_heard_from_s" not in heard:
            heard["all_heard_from_s"] = None


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--restarts", type=int, default=3, help="rounds of restarting it")
    parser.add_argument(
        "--no-terminate",
        dest="terminate",
        action="store_const",
        const=0,
        default=1,
        help="leave out the round of pg_terminate_backend",
    )
    parser.add_argument(
        "--down", type=float, default=0.0, help="seconds it stays stopped in a restart"
    )
    parser.add_argument(
        "--settle", type=float, default=25.0, help="seconds each round lasts at least"
    )
    parser.add_argument("--baseline", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument("--seed", type=int, default=9)


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 3 or args.restarts < 0 or args.restarts + args.terminate < 1:
        return "need --nodes >= 3 and at least one round"
    if not 0 <= args.down <= 600:
        return "--down must be 0 to 600 seconds"
    if args.restarts + args.terminate > args.nodes - 1:
        return "each round blocks a node: need more nodes than rounds"
    return None


async def run(bench: Bench) -> None:
    bench.out["api_server"] = API_SERVER
    restarts = RestartRun(bench)
    async with restarts.lag_measured():
        await restarts.measure()


SCENARIO = Scenario(
    "database_restart",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: ADDRESSES,
    check=check,
    measured=("oz0", "cli", "oz0_node"),
    private_postgres_port=POSTGRES_PORT,
)
