"""The web UI's live updates: from a change through one server to the event on a page
open on another (issue 11).

    python -m bench.web_live [--nodes N] [--rounds R]

The runner (bench/runner.py) starts a fresh test cluster and two real servers on
127.0.0.208 and .209 (default ports); then N real agents joined through
.208's edge with one unlimited token. Signs in to .209's web UI and holds one event stream
(`/ui/events`, read by curl, fixtures/web_events.py) naming every node, as a page listing
them does. Then R rounds, each over every node one at a time, through .208's management
API with the cluster context's operator (cli.client.ApiClient, what `orchestrator-zero
node block` runs):

1. block: from just before the request to the event showing the node `blocked` on .209,
   and to the event showing it disconnected (its stream ended by the edge);
2. unblock: from the request to the event showing it `accepted`, and to the event showing
   it connected again (the agent retries with backoff, up to 5 s apart).

Each figure is p50 / p90 / p99 / max in ms and its count. Every wait has a bound.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from bench.measure import percentiles
from bench.runner import Bench, Scenario, create_token, log
from cli.client import ApiClient
from fixtures.agent import AgentProcess
from fixtures.web_events import EventStream, signed_in
from oz0.context import Context
from oz0_common.addresses import EDGE_PORT, MANAGEMENT_PORT

CHANGED, WATCHING = "127.0.0.208", "127.0.0.209"
EVENT_BOUND = 10.0
RECONNECT_BOUND = 30.0

Check = Callable[[dict[str, Any]], bool]


def times_of(
    stream: EventStream, node_id: str, checks: dict[str, Check], timeout: float
) -> dict[str, float]:
    """When each of CHECKS first held for NODE_ID's events (one event may satisfy several:
    a read can see the state and the connection change at once)."""
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while len(seen) < len(checks):
        at, name, data = stream.next(max(0.01, deadline - time.monotonic()))
        if name != "node" or data.get("id") != node_id:
            continue
        for key, check in checks.items():
            if key not in seen and check(data):
                seen[key] = at
    return seen


def measure(bench: Bench) -> None:
    args, files, root, out = bench.args, bench.files, bench.root, bench.out
    agents: list[AgentProcess] = []
    stream: EventStream | None = None
    try:
        token = create_token(files, "bench.web_live")
        for i in range(args.nodes):
            agents.append(
                AgentProcess.joining(
                    root / f"node-{i}", [f"{CHANGED}:{EDGE_PORT}"], files.ca_hash, token=token
                ).start()
            )
        ids = [
            a.wait_status(lambda s: s.get("runtime") == "running", timeout=120)["node_id"]
            for a in agents
        ]
        log(f"{len(ids)} agents connected")
        signed_in(WATCHING, files.ui_password, root / "jar")
        stream = EventStream(
            f"https://{WATCHING}:{MANAGEMENT_PORT}/ui/events?nodes={','.join(ids)}", root / "jar",
            lifetime=3600,
        )  # fmt: skip
        connected: set[str] = set()
        deadline = time.monotonic() + EVENT_BOUND
        while connected != set(ids):
            _, name, data = stream.next(max(0.01, deadline - time.monotonic()))
            if name == "node" and data.get("connected"):
                connected.add(data["id"])
        api = ApiClient(Context.load(files.context_path))
        figures: dict[str, list[float]] = {
            "block_to_state": [], "block_to_disconnected": [],
            "unblock_to_state": [], "unblock_to_connected": [],
        }  # fmt: skip
        for round_number in range(args.rounds):
            for node_id in ids:
                sent = time.monotonic()
                api.post(f"/api/v1/nodes/{node_id}/block", {"reason": "bench.web_live"})
                seen = times_of(stream, node_id, {
                    "block_to_state": lambda d: d["state"] == "blocked",
                    "block_to_disconnected": lambda d: not d["connected"],
                }, EVENT_BOUND)  # fmt: skip
                for key, at in seen.items():
                    figures[key].append(at - sent)
            for node_id in ids:
                sent = time.monotonic()
                api.post(f"/api/v1/nodes/{node_id}/unblock", {})
                seen = times_of(stream, node_id, {
                    "unblock_to_state": lambda d: d["state"] == "accepted",
                    "unblock_to_connected": lambda d: d["connected"],
                }, RECONNECT_BOUND)  # fmt: skip
                for key, at in seen.items():
                    figures[key].append(at - sent)
            log(f"round {round_number + 1} of {args.rounds} done")
        out["figures_ms"] = {k: {**percentiles(v), "count": len(v)} for k, v in figures.items()}
    finally:
        if stream is not None:
            stream.close()
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda a: a.stop(), agents))


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)


SCENARIO = Scenario(
    "web_live",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda _: (CHANGED, WATCHING),
)
