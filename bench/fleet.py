"""A fleet of simulated nodes (fixtures/edge_client.py) streaming to the servers of a
scenario, measured phase by phase: what node_removal, block_burst and database_restart
stand on. Node i joins through the scenario's edge i % 3 and streams to it first; each
behaves as the agent does (heartbeats, its reconnect policy, purge checks)."""

from __future__ import annotations

import argparse
import gc
import json
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ec

from bench.measure import Meter, loop_lag
from bench.runner import (
    UP_TIMEOUT,
    Bench,
    create_token,
    log,
    wait_until,
    wait_until_servers,
)
from fixtures import edge_client
from fixtures.cluster import ClusterFiles, ServerProcess
from fixtures.edge_client import (
    Fleet,
    Heartbeats,
    Node,
    NodeKeys,
    SimNode,
    Streams,
    all_settled,
    join_all,
    lost_and_failed,
    run_node,
)
from oz0 import pki

BATCH = 200
BATCH_TIMEOUT = 150.0
CLOSE_TIMEOUT = 60.0


@dataclass(eq=False)
class FleetRun:
    """One run: each phase adds its section to OUT["phases"], with the servers' CPU and
    RSS and this process's loop lag over it (a Meter)."""

    bench: Bench
    phases: dict[str, Any] = field(default_factory=dict)
    meter: Meter = field(init=False)
    rng: random.Random = field(init=False)

    def __post_init__(self) -> None:
        self.meter = Meter(self.bench.servers)
        self.rng = random.Random(self.args.seed)
        self.bench.out["phases"] = self.phases

    @property
    def args(self) -> argparse.Namespace:
        return self.bench.args

    @property
    def out(self) -> dict[str, Any]:
        return self.bench.out

    @property
    def files(self) -> ClusterFiles:
        return self.bench.files

    @property
    def servers(self) -> dict[str, ServerProcess]:
        return self.bench.servers

    @property
    def edges(self) -> list[str]:
        return self.bench.edges

    def begin(self, name: str) -> None:
        self.bench.phase[0] = name
        self.meter.start()

    def end(self, name: str, section: dict[str, Any]) -> None:
        self.phases[name] = {**section, **self.meter.stop()}
        log(f"{name}: {json.dumps(self.phases[name])}")

    @asynccontextmanager
    async def lag_measured(self) -> AsyncIterator[None]:
        """This process's loop lag sampled into the meter while the body runs."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop_lag, self.meter.lag, trio.Event())
            yield
            nursery.cancel_scope.cancel()

    async def fleet(self) -> tuple[Fleet, str, bytes]:
        """Once every server is up: an empty fleet, a join token and the cluster CA, the one
        the first edge presents, checked against the cluster's hash."""
        bench = self.bench
        bench.phase[0] = "servers up"
        began = time.monotonic()
        if not await wait_until_servers(bench.files, len(bench.servers)):
            raise RuntimeError(
                f"not all {len(bench.servers)} servers were up within {UP_TIMEOUT} s"
            )
        # One more round of every edge's directory, so that welcomes list all of them.
        await trio.sleep(2.5)
        self.out["servers_up_s"] = round(time.monotonic() - began, 1)
        ca_pem, ca_hash = await edge_client.fetch_ca(bench.edges[0])
        ca_cert = pki.cert_from_pem(ca_pem)
        if ca_hash != bench.files.ca_hash or pki.ca_hash(ca_cert) != ca_hash:
            raise RuntimeError(f"edge presents CA {ca_hash}, cluster has {bench.files.ca_hash}")
        ca_key = ca_cert.public_key()
        assert isinstance(ca_key, ec.EllipticCurvePublicKey)
        description = f"bench.{bench.scenario.name}"
        token = await trio.to_thread.run_sync(create_token, bench.files, description)
        return Fleet([], Streams(), ca_key, bench.files.name, self.rng), token, ca_pem

    async def join(self, fleet: Fleet, token: str, ca_pem: bytes) -> None:
        """N nodes join through /join (node i through edge i % 3); keys made beforehand."""
        joining = []
        for _ in range(self.args.nodes):
            keys = NodeKeys.new()
            keys.ca_pem = ca_pem
            joining.append(Node(keys, keys.csr_pem()))
        self.begin("joins")
        time_limit = max(300.0, self.args.nodes * 0.2)
        edges = self.bench.edges
        results, wall, timed_out = await join_all(
            joining, token, ca_pem, 16, time_limit=time_limit, edges=edges, progress=log
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
            home = index % len(edges)
            ctx = edge_client.verified_context(ca_pem, joined.keys)
            fleet.nodes.append(SimNode(index, joined.keys, ctx, edges[home:] + edges[:home]))
        gc.collect()
        gc.freeze()  # keys and contexts live until the end: keep full collections off them

    async def ramp(self, fleet: Fleet, nursery: trio.Nursery) -> None:
        """Start the nodes BATCH at a time, each batch once the last one is settled, and the
        one task that sends their heartbeats."""
        nursery.start_soon(Heartbeats(fleet.streams, nursery).run)
        self.begin("ramp")
        for start in range(0, len(fleet.nodes), BATCH):
            batch = fleet.nodes[start : start + BATCH]
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
        fleet.streams.measuring = True

    async def close(self, fleet: Fleet, nursery: trio.Nursery) -> None:
        """End every stream, within CLOSE_TIMEOUT, then whatever else NURSERY runs."""
        self.bench.phase[0] = "close"
        fleet.streams.stop()
        with trio.move_on_after(CLOSE_TIMEOUT):
            await fleet.streams.all_closed.wait()
        nursery.cancel_scope.cancel()


def interleave(groups: Iterable[list[SimNode]]) -> list[SimNode]:
    """One from each group in turn, so that any prefix spreads over the groups."""
    lists = [list(g) for g in groups]
    out = []
    for i in range(max((len(g) for g in lists), default=0)):
        out += [g[i] for g in lists if i < len(g)]
    return out


def by_edge(nodes: list[SimNode], rng: random.Random, edges: Iterable[str]) -> list[SimNode]:
    """The live nodes, shuffled, interleaved by the edge of their stream."""
    groups: dict[str, list[SimNode]] = {edge: [] for edge in edges}
    for node in nodes:
        if node.edge is not None:
            groups[node.edge].append(node)
    for group in groups.values():
        rng.shuffle(group)
    return interleave(groups.values())
