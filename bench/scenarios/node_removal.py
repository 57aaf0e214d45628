"""Block, unblock and purge: how fast a node is shut out, let back in and removed (issue 5).

    python -m bench.node_removal [--nodes N] [--blocks B] [--burst K] [--blocked-for S]
                                 [--purges P] [--agents A] [--seed SEED] [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and three real servers on
127.0.0.51, .52 and .53 (default ports); then, from this one process:

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
6. closes the streams and stops the agents; its figures: per phase the servers' CPU and
   RSS and this process's loop lag; every stream that ended or failed unexpectedly; the
   `edges` messages.

Every phase has a time bound. The simulated nodes are fixtures/edge_client.py's.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.fleet import FleetRun, by_edge
from bench.measure import (
    audit_counts,
    nodes_in_db,
    percentiles,
    sample_server_ages,
    utc_stamp,
)
from bench.operator import (
    Api,
    Change,
    all_done,
    block_seen,
    change_nodes,
    forgotten_seen,
    send_one_after_another,
    split_summary,
    summary,
    welcome_seen,
)
from bench.runner import Bench, Scenario, log, wait_until
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles
from fixtures.edge_client import Fleet, SimNode, lost_and_failed
from oz0.context import MANAGEMENT_PORT
from oz0_common.addresses import EDGE_PORT

ADDRESSES = ("127.0.0.51", "127.0.0.52", "127.0.0.53")
EDGES = [f"{address}:{EDGE_PORT}" for address in ADDRESSES]
# Every block, unblock and purge goes through this server's management API.
API_ADDRESS = ADDRESSES[0]
API_SERVER = f"{API_ADDRESS}:{MANAGEMENT_PORT}"

# What issue 5 asks for, and what docs/node-protocol.md promises.
BLOCK_TARGET_P99 = 0.2
BLOCK_DOCUMENTED = 2.0
UNBLOCK_TARGET_P99 = 5.0
UNBLOCK_DOCUMENTED = 10.0

# Bounds, so that a server that stops answering cannot keep the run going.
AGENTS_UP_TIMEOUT = 120.0
BLOCK_WAIT = 5.0
BURST_WAIT = 15.0
UNBLOCK_WAIT = 30.0
PURGE_WAIT = 15.0
AGENT_PURGE_WAIT = 30.0
PHASE_LIMIT = 600.0
POLL = 0.01


# --- the operator's changes --------------------------------------------------------------


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


@dataclass(eq=False)
class Run(FleetRun):
    """One run: each phase a method that adds its section to OUT["phases"]."""

    agents: list[Agent] = field(default_factory=list)

    async def measure(self) -> None:
        fleet, token, ca_pem = await self.fleet()
        self.out["phases_utc"] = [utc_stamp(), None]
        await self.join(fleet, token, ca_pem)
        async with (
            Api.running(self.files, API_SERVER, max(self.args.burst, 1)) as api,
            trio.open_nursery() as nursery,
        ):
            self.meter.others["operator"] = api.process.pid
            ages: dict[str, list[float]] = {}
            nursery.start_soon(sample_server_ages, self.files, ages)
            await self.ramp(fleet, nursery)
            if self.args.agents:
                await self.start_agents(token)

            self.begin("baseline")
            await trio.sleep(self.args.baseline)
            self.end("baseline", {"open_streams": fleet.streams.open})

            chosen = by_edge(fleet.nodes, self.rng, EDGES)
            blocks = await self.block(api, chosen[: self.args.blocks])
            await self.unblock(api, blocks)
            to_purge = chosen[self.args.blocks : self.args.blocks + self.args.purges]
            await self.purge(api, to_purge)
            if self.agents:
                await self.purge_agents(api)

            self.bench.phase[0] = "end"
            self.out["phases_utc"][1] = utc_stamp()
            self.out["end"] = await self.final_state(fleet, ages)
            log(f"end: {json.dumps(self.out['end'])}")
            await self.close(fleet, nursery)
        self.out["targets"] = targets(self.phases)
        self.bench.phase[0] = "done"

    async def start_agents(self, token: str) -> None:
        self.begin("agents_start")
        agents = self.agents
        agents.extend(start_agents(self.bench.root, self.args.agents, self.files, token))
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
            section = split_summary(group, block_seen, BLOCK_DOCUMENTED, API_ADDRESS)
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
                "one_at_a_time": split_summary(
                    purges[:half], forgotten_seen, BLOCK_DOCUMENTED, API_ADDRESS
                ),
                "bursts": split_summary(
                    purges[half:], forgotten_seen, BLOCK_DOCUMENTED, API_ADDRESS
                ),
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
            "heartbeat_gaps": streams.gap_summary(),
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


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--blocks", type=int, default=300, help="nodes blocked and unblocked")
    parser.add_argument("--burst", type=int, default=50, help="concurrent requests per burst")
    parser.add_argument("--blocked-for", type=float, default=20.0, help="seconds before unblock")
    parser.add_argument("--purges", type=int, default=100, help="simulated nodes purged")
    parser.add_argument("--agents", type=int, default=10, help="real agents purged")
    parser.add_argument("--baseline", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument("--seed", type=int, default=5)


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 3 or args.burst < 1 or args.blocks + args.purges > args.nodes:
        return "need --nodes >= 3, --burst >= 1 and --blocks + --purges <= --nodes"
    return None


async def run(bench: Bench) -> None:
    bench.out["api_server"] = API_SERVER
    removal = Run(bench)
    try:
        async with removal.lag_measured():
            await removal.measure()
    finally:
        for agent in removal.agents:
            agent.process.stop()


SCENARIO = Scenario(
    "node_removal",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: ADDRESSES,
    check=check,
    # The servers, the CLI's client, and the agent (real, and the reconnect policy).
    measured=("oz0", "cli", "oz0_node"),
)
