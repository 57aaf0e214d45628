"""The soak's operators (issue 44): people added and removed, nodes blocked and unblocked
(each block probed from its node: its status.json polled until the node says it is
blocked, and its runtime stopped; and every server's Temporal asked with the node's own
identity until it refuses it: bench/soak_probe.py), nodes purged and a new agent joined
in the purged one's place. Each on an agent nothing else holds meanwhile (bench/soak_fleet.py).
"""

from __future__ import annotations

import random
import time
from functools import partial
from typing import Any

import psycopg
import trio

from bench.runner import log, wait_until
from bench.soak_fleet import Agent
from bench.soak_model import BlockProbe, Change
from bench.soak_probe import TemporalProbe
from bench.soak_state import ADDRESSES, Failed, Soak
from bench.soak_workload import Action

UNBLOCK_TRIES = 60
PROBE_WATCH = 30.0
# The tenant of the soak's nodes (they join with a token of `default`): their namespace.
NAMESPACE = "default"


async def operator_action(soak: Soak, action: Action, rng: random.Random) -> None:
    if action.kind == "person":
        await person(soak, action.hold)
        return
    agent = soak.fleet.free_agent(rng)
    if agent is None:
        return
    agent.busy = action.kind
    try:
        if action.kind == "block":
            await block(soak, agent, action.hold)
        elif action.kind == "purge":
            await purge(soak, agent)
    finally:
        agent.busy = None


async def person(soak: Soak, hold: float) -> None:
    soak.people += 1
    name = f"soak-person-{soak.people}"
    if await soak.call("POST", "/api/v1/operators", {"name": name, "role": "viewer"}):
        soak.changes.append(Change("operator.add", f"operator:{name}", soak.minute()))
        await trio.sleep(hold)
        if await soak.call("DELETE", f"/api/v1/operators/{name}") is not None:
            soak.changes.append(Change("operator.remove", f"operator:{name}", soak.minute()))


async def block(soak: Soak, agent: Agent, hold: float) -> None:
    node = agent.node_id
    before = agent.process.reported()
    stopped = soak.stopped_servers()
    sent = time.time()
    during = bool(soak.active)
    # Temporal, asked with the node's own identity from before the block is sent (its
    # connections made by the answer) until every server refuses it.
    temporal = TemporalProbe(agent.data_dir, NAMESPACE, ADDRESSES)
    async with trio.open_nursery() as probing:
        probing.start_soon(partial(trio.to_thread.run_sync, temporal.run, sent + PROBE_WATCH + 5.0))
        try:
            probe = await probe_block(soak, agent, temporal, before, stopped, sent, during)
        finally:
            temporal.stop.set()
    if probe is None:
        return
    soak.blocks.append(probe)
    soak.block_during_fault.append(during or bool(soak.active))
    await trio.sleep(hold)
    for _ in range(UNBLOCK_TRIES):
        if await soak.call("POST", f"/api/v1/nodes/{node}/unblock", {}) is not None:
            soak.changes.append(Change("node.unblock", f"node:{node}", soak.minute()))
            return
        await trio.sleep(2.0)
    raise Failed(f"{node} could not be unblocked in {UNBLOCK_TRIES} tries")


async def probe_block(
    soak: Soak,
    agent: Agent,
    temporal: TemporalProbe,
    before: dict[str, Any],
    stopped: set[str],
    sent: float,
    during: bool,
) -> BlockProbe | None:
    """The block of AGENT's node sent, and its effect seen from the node's side; None if
    the API did not take it."""
    node = agent.node_id
    answer = await soak.call("POST", f"/api/v1/nodes/{node}/block", {"reason": "soak"})
    if answer is None:
        return None
    soak.changes.append(Change("node.block", f"node:{node}", soak.minute(sent)))
    took = None

    answered = time.time()
    # The node's side: its stream refused `blocked` (judged), and its runtime (the
    # Temporal worker, whose calls the block refuses) stopped (reported); every server's
    # Temporal refusing the node's calls (judged).
    seen: dict[str, float] = {}

    def refused() -> bool:
        reported = agent.process.reported()
        if reported.get("runtime") != "running":
            seen.setdefault("runtime", time.time())
        if reported.get("state") == "blocked":
            seen.setdefault("refused", time.time())
        return len(seen) == 2 and len(temporal.refused) == len(ADDRESSES)

    await wait_until(refused, PROBE_WATCH)
    if "refused" in seen:
        took = seen["refused"] - answered
    if "runtime" in seen:
        soak.runtime_stopped.append(seen["runtime"] - answered)
    # A server whose Temporal a fault stopped, paused or killed meanwhile: not judged;
    # nor any when the probe itself could not run (the soak's trouble, said).
    disturbed = soak.temporal_disturbed(sent)
    # And a Temporal the probe could not reach before it refused: its host was down
    # (restarting after a kill that came before the block), so what it took is the host's
    # start, not the block's (a restarted host is given the blocks it missed as it serves:
    # oz0/temporal/role.py's host_states).
    disturbed |= temporal.unreachable
    if temporal.failed is not None:
        log(f"the Temporal probe of {node}'s block could not run: {temporal.failed}")
        soak.probe_failures.append(temporal.failed[:200])
        disturbed = set(ADDRESSES)
    judged = tuple(
        (address, None if at is None else max(0.0, at - answered))
        for address in ADDRESSES
        if address not in disturbed
        for at in [temporal.refused.get(address)]
    )
    # A node whose stream is on a server a fault stopped (or none) hears of nothing
    # until it is on another: its block is reported, not judged.
    exempt = None
    if before.get("connected") is not True:
        exempt = "not connected when blocked"
    else:
        try:
            home = await trio.to_thread.run_sync(soak.server_address, before.get("server"))
        except psycopg.Error:
            home = None
        if home in stopped | soak.stopped_servers():
            exempt = f"its stream was on {home}, stopped by a fault"
    return BlockProbe(node, soak.minute(sent), took, answered - sent, exempt, judged)


async def purge(soak: Soak, agent: Agent) -> None:
    node = agent.node_id
    if await soak.call("POST", f"/api/v1/nodes/{node}/purge", {}) is None:
        return
    soak.changes.append(Change("node.purge", f"node:{node}", soak.minute()))
    agent.gone = True
    process = agent.process.process
    assert process is not None
    if not await wait_until(lambda: process.poll() is not None, 60):
        log(f"agent {agent.index} did not exit within 60 s of its purge")
        return
    await soak.fleet.rejoin(agent)
