"""The soak's operators (issue 44): people added and removed, nodes blocked and unblocked
(each block probed from its node: its status.json polled until the node says it is
blocked, and its runtime stopped), nodes purged and a new agent joined in the purged
one's place. Each on an agent nothing else holds meanwhile (bench/soak_fleet.py).
"""

from __future__ import annotations

import random
import time

import psycopg
import trio

from bench.runner import log, wait_until
from bench.soak_check import BlockProbe, Change
from bench.soak_fleet import Agent
from bench.soak_state import Failed, Soak
from bench.soak_workload import Action

UNBLOCK_TRIES = 60
PROBE_WATCH = 30.0


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
    answer = await soak.call("POST", f"/api/v1/nodes/{node}/block", {"reason": "soak"})
    if answer is None:
        return
    soak.changes.append(Change("node.block", f"node:{node}", soak.minute(sent)))
    took = None

    answered = time.time()
    # The node's side: its stream refused `blocked` (judged), and its runtime (the
    # Temporal worker, whose calls the block refuses) stopped (reported).
    seen: dict[str, float] = {}

    def refused() -> bool:
        reported = agent.process.reported()
        if reported.get("runtime") != "running":
            seen.setdefault("runtime", time.time())
        if reported.get("state") == "blocked":
            seen.setdefault("refused", time.time())
        return len(seen) == 2

    await wait_until(refused, PROBE_WATCH)
    if "refused" in seen:
        took = seen["refused"] - answered
    if "runtime" in seen:
        soak.runtime_stopped.append(seen["runtime"] - answered)
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
    probe = BlockProbe(node, soak.minute(sent), took, answered - sent, exempt)
    soak.blocks.append(probe)
    soak.block_during_fault.append(during or bool(soak.active))
    await trio.sleep(hold)
    for _ in range(UNBLOCK_TRIES):
        if await soak.call("POST", f"/api/v1/nodes/{node}/unblock", {}) is not None:
            soak.changes.append(Change("node.unblock", f"node:{node}", soak.minute()))
            return
        await trio.sleep(2.0)
    raise Failed(f"{node} could not be unblocked in {UNBLOCK_TRIES} tries")


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
