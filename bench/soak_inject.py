"""The soak's faults injected (issue 44): the schedule of bench/soak_faults.py played at
its times, at most one control-plane and one node fault at a time: a server SIGKILLed
(its Temporal host with it), SIGTERMed or paused and started again, a Temporal host
SIGKILLed, PostgreSQL restarted or its backends terminated; an agent SIGKILLed and
resumed, paused, its network cut in its namespace (bench/soak_netns.py), its disk filled.
A fault with no target free (an agent held by an action) is skipped and counted; one this
machine cannot inject (a tool it lacks) is counted as failed, not as the cluster's fault.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

import trio

from bench.runner import log, wait_until
from bench.soak_faults import CONTROL_PLANE, Fault
from bench.soak_fleet import Agent
from bench.soak_model import Exit, FaultSpan
from bench.soak_netns import CUTS
from bench.soak_state import ADDRESSES, SERVER_START_TIMEOUT, Soak
from fixtures.agent import AgentProcess


async def faults(soak: Soak, schedule: list[Fault], nursery: trio.Nursery) -> None:
    for fault in schedule:
        await trio.sleep(max(0.0, soak.started + fault.at - time.time()))
        nursery.start_soon(inject, soak, fault)


async def inject(soak: Soak, fault: Fault) -> None:
    target = fault_target(soak, fault)
    if target is None:
        soak.faults_skipped[fault.kind] += 1
        return
    log(f"fault at minute {soak.minute():.2f}: {fault.kind} on {target} for {fault.hold:.1f} s")
    began = soak.minute()
    soak.active.append(fault)
    soak.faults_done[fault.kind] += 1
    try:
        if fault.kind in CONTROL_PLANE:
            await control_plane_fault(soak, fault)
        else:
            await node_fault(soak, fault, agent_for(soak, fault))
    except subprocess.CalledProcessError as e:
        # A tool this machine lacks (a qdisc, say): said, not the cluster's fault.
        why = (e.stderr or b"").decode(errors="replace").strip()[:200]
        soak.faults_failed[f"{fault.kind}: {' '.join(map(str, e.cmd))[:100]}: {why}"] += 1
        soak.faults_done[fault.kind] -= 1
        log(f"fault {fault.kind} could not be injected: {why}")
    finally:
        soak.fault_spans.append(FaultSpan(fault.kind, target, began, soak.minute()))
        soak.active.remove(fault)


def fault_target(soak: Soak, fault: Fault) -> str | None:
    if fault.kind in CONTROL_PLANE:
        return "postgres" if fault.kind.startswith("postgres") else ADDRESSES[fault.target]
    agent = agent_for(soak, fault)
    return None if agent is None else f"agent {agent.index}"


def agent_for(soak: Soak, fault: Fault) -> Agent | None:
    agents = soak.fleet.agents
    if fault.kind == "disk_full":
        first = agents[0]
        return first if first.busy is None else None
    free = [a for a in agents[1:] if a.busy is None and not a.gone]
    if fault.kind == "net_cut":
        free = [a for a in free if a.namespace is not None]
    return free[fault.target % len(free)] if free else None


async def control_plane_fault(soak: Soak, fault: Fault) -> None:
    postgres = soak.bench.postgres
    assert postgres is not None
    if fault.kind == "postgres_restart":
        await trio.to_thread.run_sync(postgres.stop)
        await trio.sleep(fault.hold)
        await trio.to_thread.run_sync(postgres.start)
        return
    if fault.kind == "postgres_terminate":
        await trio.to_thread.run_sync(postgres.terminate_backends)
        return
    address = ADDRESSES[fault.target]
    server = soak.servers[address]
    process = server.process
    assert process is not None
    if fault.kind == "temporal_host_kill":
        for pid in server.children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return
    if fault.kind == "server_pause":
        process.send_signal(signal.SIGSTOP)
        try:
            await trio.sleep(fault.hold)
        finally:
            process.send_signal(signal.SIGCONT)
        return
    soak.planned_down.add(address)
    try:
        if fault.kind == "server_kill":
            hosts = server.children()
            process.kill()
            for pid in hosts:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        else:
            process.send_signal(signal.SIGTERM)
        if not await wait_until(lambda: process.poll() is not None, 60):
            process.kill()
        await trio.to_thread.run_sync(server.wait, 30)
        soak.exits.append(Exit(f"server {address}", soak.minute(), process.returncode, True))
        await trio.sleep(fault.hold)
        await trio.to_thread.run_sync(lambda: server.start(timeout=SERVER_START_TIMEOUT))
    finally:
        soak.planned_down.discard(address)


async def node_fault(soak: Soak, fault: Fault, agent: Agent | None) -> None:
    if agent is None:
        return
    agent.busy = fault.kind
    try:
        process = agent.process.process
        assert process is not None
        if fault.kind == "agent_kill":
            process.kill()
            await trio.to_thread.run_sync(process.wait, 30)
            await trio.sleep(fault.hold)
            agent.start(AgentProcess.resuming(agent.data_dir))
        elif fault.kind == "agent_pause":
            process.send_signal(signal.SIGSTOP)
            try:
                await trio.sleep(fault.hold)
            finally:
                process.send_signal(signal.SIGCONT)
        elif fault.kind == "net_cut":
            assert agent.namespace is not None
            how = CUTS[fault.target % len(CUTS)]
            soak.net_cuts[how] += 1
            await trio.to_thread.run_sync(agent.namespace.cut, how)
            try:
                await trio.sleep(fault.hold)
            finally:
                await trio.to_thread.run_sync(agent.namespace.mend)
        elif fault.kind == "disk_full":
            assert soak.fleet.disk_mount is not None
            filler = soak.fleet.disk_mount / "filler"
            await trio.to_thread.run_sync(fill, filler)
            try:
                await trio.sleep(fault.hold)
            finally:
                filler.unlink(missing_ok=True)
    finally:
        agent.busy = None


def fill(path: Path) -> None:
    """Write zeros to PATH until its file system is full."""
    chunk = b"\0" * (1 << 20)
    with path.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(chunk)
            out.flush()
