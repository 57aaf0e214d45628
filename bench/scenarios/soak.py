"""An hour of faults under load, checked by a ledger on the nodes (issue 44).

    python -m bench.soak [--minutes M] [--seed S] [--agents N] [--rate R]
                         [--faults KIND,...] [--actions KIND=W,...] [--server-logs DIR]

The runner (bench/runner.py) starts a PostgreSQL of the run's own on 127.0.0.1:5444 (so
that it can be restarted; fixtures/private_postgres.py), a cluster in it and three real
servers on 127.0.0.44, .45 and .46; then N real agents (fixtures/agent.py), agent i given
edge i % 3 first and the label soak-group=i % 5, agent 0's data directory on a small tmpfs
of its own (the disk that fills), the last min(4, N/4) in network namespaces of their own
(bench/soak_netns.py: the nodes whose network is cut). For M minutes, from seed S:

- the workload (bench/soak_workload.py) sends jobs of every kind through the management
  API of the three servers in turn (single, retried, --all, rolling batches with
  --max-failures, timeouts, cancels, --on-lost move|wait|fail, secrets, limits, and a
  schedule every minute), blocks and unblocks nodes (each block probed from its node: its
  status.json polled until the node says it is blocked), purges a node and joins a new
  agent in its place, adds and removes people; every command runs under the ledger's
  wrapper (bench/soak_ledger.py);
- the fault schedule (bench/soak_faults.py), printed on stderr and in the document before
  anything runs, injects at most one control-plane and one node fault at a time;
- the servers' and agents' RSS and the cluster's database connections are sampled, and
  every server exit is recorded (planned by a fault or not).

Then the workload stops (the schedule is deleted), every job is waited for until it has
ended or its bound passed, and the checker (bench/soak_check.py) compares the ledger with
the store's jobs, attempts, output and audit rows. The document's `violations` (each with
the seed and the minute) and `faults` (counts by kind) are among its figures; a run with a
violation exits 1 (`failed` names the first).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import hashlib
import json
import os
import random
import signal
import subprocess
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio

from bench.measure import percentiles, rss_mib
from bench.runner import Bench, Scenario, create_token, log, wait_until, wait_until_servers
from bench.soak_check import (
    AttemptRecord,
    BlockProbe,
    Change,
    Exit,
    JobRecord,
    Records,
    Sample,
    check,
    read_ledger,
)
from bench.soak_faults import CONTROL_PLANE, KINDS, Fault, plan
from bench.soak_ledger import Ledger, ledger
from bench.soak_netns import CUTS, Namespace, namespaces
from bench.soak_workload import (
    ACTIONS,
    GROUP_LABEL,
    GROUPS,
    MADE,
    MARGIN,
    QUEUE_TIMEOUT,
    Action,
    JobPlan,
    draw,
)
from cli.client import ApiClient, ApiError
from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import ServerProcess
from oz0.context import MANAGEMENT_PORT, Context

ADDRESSES = ("127.0.0.44", "127.0.0.45", "127.0.0.46")
EDGES = [f"{address}:7443" for address in ADDRESSES]
POSTGRES_PORT = 5444
# The network namespaces of the agents cut off (README: .47-.50 are the soak's).
NAMESPACES = (47, 48, 49, 50)
APP_NAME = "oz0-soak"  # the soak's own database sessions, not counted as the cluster's

# Each server's database connections at most, as docs/run-a-cluster.md has operators size
# PostgreSQL for ("max_connections of at least 100 per server"): its pool (8), the
# membership's (1), its listeners, and its Temporal host's services, each with pools of
# its own (oz0/temporal/host/config.go: 10, and 4 for visibility).
CONNECTIONS_PER_SERVER = 100
SAMPLE_EVERY = 5.0
EXIT_POLL = 0.5
UNBLOCK_TRIES = 60
PROBE_WATCH = 30.0
AGENTS_UP_TIMEOUT = 300.0
SERVER_START_TIMEOUT = 180.0
DISK_MIB = 24
API_THREADS = 16


class Failed(Exception):
    """The soak could not go on (not a violation: the cluster is not judged by it)."""


@dataclass(eq=False)
class Agent:
    """One agent slot: the agent running now (a purge gives the slot a new one)."""

    index: int
    data_dir: Path
    process: AgentProcess
    node_id: str = ""
    # A fault or an action holds it: nothing else is done to it meanwhile.
    busy: str | None = None
    # Purged and not yet joined again: no fault, no action.
    gone: bool = False
    generation: int = 0
    # Its network namespace, if it runs in one (soak_netns.py).
    namespace: Namespace | None = None

    def start(self, process: AgentProcess) -> None:
        if self.namespace is not None:
            process.prefix = self.namespace.prefix
        self.process = process.start()


@dataclass(eq=False)
class Soak:
    bench: Bench
    ledger: Ledger
    agents: list[Agent] = field(default_factory=list)
    token: str = ""
    started: float = 0.0
    ends: float = 0.0
    context: Context | None = None
    api_turn: int = 0
    # What the workload made, by job ID: its plan, when it was sent (wall clock).
    jobs: dict[str, tuple[JobPlan, float]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    blocks: list[BlockProbe] = field(default_factory=list)
    block_during_fault: list[bool] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    rss: list[Sample] = field(default_factory=list)
    connections: list[tuple[float, int]] = field(default_factory=list)
    connections_at_peak: dict[str, int] = field(default_factory=dict)
    api_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    api_errors: Counter[str] = field(default_factory=Counter)
    faults_done: Counter[str] = field(default_factory=Counter)
    faults_skipped: Counter[str] = field(default_factory=Counter)
    net_cuts: Counter[str] = field(default_factory=Counter)
    faults_failed: Counter[str] = field(default_factory=Counter)
    # After each block's answer, the seconds until its node's runtime stopped.
    runtime_stopped: list[float] = field(default_factory=list)
    active: list[Fault] = field(default_factory=list)
    # Servers a fault has taken down on purpose (by address).
    planned_down: set[str] = field(default_factory=set)
    actions: Counter[str] = field(default_factory=Counter)
    people: int = 0
    schedule_id: str | None = None
    disk_mount: Path | None = None
    limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(API_THREADS))

    @property
    def args(self) -> argparse.Namespace:
        return self.bench.args

    @property
    def servers(self) -> dict[str, ServerProcess]:
        return self.bench.servers

    def minute(self, at: float | None = None) -> float:
        return ((time.time() if at is None else at) - self.started) / 60.0

    def progress(self) -> dict[str, Any]:
        return {
            "minute": round(self.minute(), 2) if self.started else None,
            "jobs": len(self.jobs),
            "faults": dict(self.faults_done),
            "active": [f.to_json() for f in self.active],
        }

    # --- the API -----------------------------------------------------------------------

    def client(self) -> ApiClient:
        """A client trying the three servers, starting with the next in turn."""
        assert self.context is not None
        self.api_turn += 1
        first = self.api_turn % len(ADDRESSES)
        order = ADDRESSES[first:] + ADDRESSES[:first]
        servers = tuple(f"{a}:{MANAGEMENT_PORT}" for a in order)
        return ApiClient(dataclasses.replace(self.context, servers=servers), learn_servers=False)

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The API's answer, or None when it refused or none answered (counted)."""
        client = self.client()
        began = time.monotonic()
        try:
            answer = await trio.to_thread.run_sync(
                lambda: client.request(method, path, body), limiter=self.limiter
            )
        except ApiError as e:
            self.api_errors[str(e).split(":")[0][:80]] += 1
            return None
        finally:
            client.close()
        took = time.monotonic() - began
        self.api_ms["during_faults" if self.active else "outside_faults"].append(took)
        return answer

    # --- set-up ------------------------------------------------------------------------

    def start_agents(self) -> None:
        count = self.args.agents
        log(f"starting {count} agents")
        self.token = create_token(self.bench.files, "bench.soak")
        base = self.bench.root / "agents"
        base.mkdir()
        # The last few agents in network namespaces of their own (the nodes cut off).
        held = min(len(NAMESPACES), count // 4)
        spaces = self.bench.cleanups.enter_context(namespaces(NAMESPACES[:held], ADDRESSES))
        in_space = dict(zip(range(count - held, count), spaces, strict=True))
        for i in range(count):
            data_dir = base / f"node-{i}"
            if i == 0:
                # The agent whose disk fills: its data directory on a small tmpfs.
                mount = base / "oz0soak-disk"
                mount.mkdir()
                subprocess.run(
                    ["mount", "-t", "tmpfs", "-o", f"size={DISK_MIB}m,mode=0700", "tmpfs",
                     str(mount)], check=True, capture_output=True,
                )  # fmt: skip
                self.disk_mount = mount
                self.bench.cleanups.callback(
                    subprocess.run, ["umount", "-l", str(mount)], capture_output=True
                )
                data_dir = mount / "node"
            agent = AgentProcess.joining(
                data_dir, EDGES[i % 3 :] + EDGES[: i % 3], self.bench.files.ca_hash,
                token=self.token, labels=group_of(i),
            )  # fmt: skip
            slot = Agent(i, data_dir, agent, namespace=in_space.get(i))
            self.agents.append(slot)
            slot.start(agent)
        # Last in, first out: the agents stop before the tmpfs goes.
        self.bench.cleanups.callback(self.stop_agents)
        deadline = time.monotonic() + AGENTS_UP_TIMEOUT
        while True:
            up = [a for a in self.agents if connected(a.process)]
            if len(up) == len(self.agents):
                break
            if time.monotonic() > deadline:
                dead = [a for a in self.agents if a not in up]
                raise Failed(
                    f"only {len(up)} of {count} agents connected:\n{dead[0].process.log()[-1500:]}"
                )
            time.sleep(0.5)
        for slot in self.agents:
            slot.node_id = str(slot.process.reported()["node_id"])

    def stop_agents(self) -> None:
        for agent in self.agents:
            with contextlib.suppress(ProcessLookupError, AttributeError):
                if agent.process.process is not None:
                    os.kill(agent.process.process.pid, signal.SIGCONT)
        stop_all([a.process for a in self.agents])

    # --- the workload ------------------------------------------------------------------

    async def workload(self, nursery: trio.Nursery) -> None:
        rng = random.Random(self.args.seed * 7919 + 1)
        weights = {**ACTIONS, **self.args.actions}
        schedule = await self.call(
            "POST",
            "/api/v1/schedules",
            {
                "job": {
                    "tenant": "default",
                    "command": self.ledger.wrapped(["sh", "-c", 'echo "$OZ0_JOB_ID scheduled"']),
                    "name": "soak schedule",
                },
                "cron": "* * * * *",
            },
        )
        if schedule is not None:
            self.schedule_id = str(schedule["id"])
            self.changes.append(Change("schedule.create", f"schedule:{self.schedule_id}", 0.0))
        while time.time() < self.ends:
            await trio.sleep(rng.expovariate(self.args.rate))
            if time.time() >= self.ends:
                break
            what = draw(rng, len(self.agents), weights)
            self.actions[what.kind] += 1
            if isinstance(what, JobPlan):
                nursery.start_soon(self.run_job, what)
            else:
                nursery.start_soon(self.operator_action, what, random.Random(rng.random()))
        if self.schedule_id is not None:
            gone = await self.call("DELETE", f"/api/v1/schedules/{self.schedule_id}")
            if gone is not None:
                self.changes.append(
                    Change("schedule.delete", f"schedule:{self.schedule_id}", self.minute())
                )

    async def run_job(self, job: JobPlan) -> None:
        body = {**job.body, "command": self.ledger.wrapped(job.body["command"])}
        sent = time.time()
        made = await self.call("POST", "/api/v1/jobs", body)
        if made is None:
            return
        job_id = str(made["id"])
        self.jobs[job_id] = (job, sent)
        self.changes.append(Change("job.run", f"job:{job_id}", self.minute(sent)))
        if job.cancel_after is not None:
            await trio.sleep(job.cancel_after)
            if await self.call("POST", f"/api/v1/jobs/{job_id}/cancel", {}) is not None:
                self.changes.append(Change("job.cancel", f"job:{job_id}", self.minute()))

    def free_agent(self, rng: random.Random) -> Agent | None:
        """An agent nothing holds, connected, not agent 0 (its disk fills)."""
        free = [a for a in self.agents[1:] if a.busy is None and not a.gone]
        rng.shuffle(free)
        return next((a for a in free if connected(a.process)), None)

    async def operator_action(self, action: Action, rng: random.Random) -> None:
        if action.kind == "person":
            self.people += 1
            name = f"soak-person-{self.people}"
            if await self.call("POST", "/api/v1/operators", {"name": name, "role": "viewer"}):
                self.changes.append(Change("operator.add", f"operator:{name}", self.minute()))
                await trio.sleep(action.hold)
                if await self.call("DELETE", f"/api/v1/operators/{name}") is not None:
                    self.changes.append(
                        Change("operator.remove", f"operator:{name}", self.minute())
                    )
            return
        agent = self.free_agent(rng)
        if agent is None:
            return
        agent.busy = action.kind
        try:
            if action.kind == "block":
                await self.block(agent, action.hold)
            elif action.kind == "purge":
                await self.purge(agent)
        finally:
            agent.busy = None

    def stopped_servers(self) -> set[str]:
        """The servers (by address) a fault has stopped or paused now."""
        stopping = ("server_kill", "server_term", "server_pause")
        return {ADDRESSES[f.target] for f in self.active if f.kind in stopping}

    def server_address(self, server_id: object) -> str | None:
        with self.store() as conn:
            row = conn.execute(
                "SELECT advertise FROM servers WHERE id = %s", (str(server_id),)
            ).fetchone()
        return str(row[0]) if row else None

    async def block(self, agent: Agent, hold: float) -> None:
        node = agent.node_id
        before = agent.process.reported()
        stopped = self.stopped_servers()
        sent = time.time()
        during = bool(self.active)
        answer = await self.call("POST", f"/api/v1/nodes/{node}/block", {"reason": "soak"})
        if answer is None:
            return
        self.changes.append(Change("node.block", f"node:{node}", self.minute(sent)))
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
            self.runtime_stopped.append(seen["runtime"] - answered)
        # A node whose stream is on a server a fault stopped (or none) hears of nothing
        # until it is on another: its block is reported, not judged.
        exempt = None
        if before.get("connected") is not True:
            exempt = "not connected when blocked"
        else:
            try:
                home = await trio.to_thread.run_sync(self.server_address, before.get("server"))
            except psycopg.Error:
                home = None
            if home in stopped | self.stopped_servers():
                exempt = f"its stream was on {home}, stopped by a fault"
        probe = BlockProbe(node, self.minute(sent), took, answered - sent, exempt)
        self.blocks.append(probe)
        self.block_during_fault.append(during or bool(self.active))
        await trio.sleep(hold)
        for _ in range(UNBLOCK_TRIES):
            if await self.call("POST", f"/api/v1/nodes/{node}/unblock", {}) is not None:
                self.changes.append(Change("node.unblock", f"node:{node}", self.minute()))
                return
            await trio.sleep(2.0)
        raise Failed(f"{node} could not be unblocked in {UNBLOCK_TRIES} tries")

    async def purge(self, agent: Agent) -> None:
        node = agent.node_id
        if await self.call("POST", f"/api/v1/nodes/{node}/purge", {}) is None:
            return
        self.changes.append(Change("node.purge", f"node:{node}", self.minute()))
        agent.gone = True
        process = agent.process.process
        assert process is not None
        if not await wait_until(lambda: process.poll() is not None, 60):
            log(f"agent {agent.index} did not exit within 60 s of its purge")
            return
        agent.generation += 1
        agent.data_dir = agent.data_dir.with_name(f"node-{agent.index}-{agent.generation}")
        i = agent.index
        agent.start(
            AgentProcess.joining(
                agent.data_dir, EDGES[i % 3 :] + EDGES[: i % 3], self.bench.files.ca_hash,
                token=self.token, labels=group_of(i),
            )
        )  # fmt: skip
        if await wait_until(lambda: connected(agent.process), 120):
            agent.node_id = str(agent.process.reported()["node_id"])
            agent.gone = False

    # --- the faults --------------------------------------------------------------------

    async def faults(self, schedule: list[Fault], nursery: trio.Nursery) -> None:
        for fault in schedule:
            await trio.sleep(max(0.0, self.started + fault.at - time.time()))
            nursery.start_soon(self.inject, fault)

    async def inject(self, fault: Fault) -> None:
        target = self.fault_target(fault)
        if target is None:
            self.faults_skipped[fault.kind] += 1
            return
        log(f"fault at minute {self.minute():.2f}: {fault.kind} on {target} for {fault.hold:.1f} s")
        self.active.append(fault)
        self.faults_done[fault.kind] += 1
        try:
            if fault.kind in CONTROL_PLANE:
                await self.control_plane_fault(fault)
            else:
                await self.node_fault(fault, self.agent_for(fault))
        except subprocess.CalledProcessError as e:
            # A tool this machine lacks (a qdisc, say): said, not the cluster's fault.
            why = (e.stderr or b"").decode(errors="replace").strip()[:200]
            self.faults_failed[f"{fault.kind}: {' '.join(map(str, e.cmd))[:100]}: {why}"] += 1
            self.faults_done[fault.kind] -= 1
            log(f"fault {fault.kind} could not be injected: {why}")
        finally:
            self.active.remove(fault)

    def fault_target(self, fault: Fault) -> str | None:
        if fault.kind in CONTROL_PLANE:
            return "postgres" if fault.kind.startswith("postgres") else ADDRESSES[fault.target]
        agent = self.agent_for(fault)
        return None if agent is None else f"agent {agent.index}"

    def agent_for(self, fault: Fault) -> Agent | None:
        if fault.kind == "disk_full":
            first = self.agents[0]
            return first if first.busy is None else None
        free = [a for a in self.agents[1:] if a.busy is None and not a.gone]
        if fault.kind == "net_cut":
            free = [a for a in free if a.namespace is not None]
        return free[fault.target % len(free)] if free else None

    async def control_plane_fault(self, fault: Fault) -> None:
        postgres = self.bench.postgres
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
        server = self.servers[address]
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
        self.planned_down.add(address)
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
            self.exits.append(Exit(f"server {address}", self.minute(), process.returncode, True))
            await trio.sleep(fault.hold)
            await trio.to_thread.run_sync(lambda: server.start(timeout=SERVER_START_TIMEOUT))
        finally:
            self.planned_down.discard(address)

    async def node_fault(self, fault: Fault, agent: Agent | None) -> None:
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
                self.net_cuts[how] += 1
                await trio.to_thread.run_sync(agent.namespace.cut, how)
                try:
                    await trio.sleep(fault.hold)
                finally:
                    await trio.to_thread.run_sync(agent.namespace.mend)
            elif fault.kind == "disk_full":
                assert self.disk_mount is not None
                filler = self.disk_mount / "filler"
                await trio.to_thread.run_sync(fill, filler)
                try:
                    await trio.sleep(fault.hold)
                finally:
                    filler.unlink(missing_ok=True)
        finally:
            agent.busy = None

    # --- watching ----------------------------------------------------------------------

    async def watch_exits(self) -> None:
        """A server that exits when no fault meant it to: recorded, and started again so
        that the soak goes on."""
        while True:
            await trio.sleep(EXIT_POLL)
            for address, server in self.servers.items():
                process = server.process
                if address in self.planned_down or process is None or process.poll() is None:
                    continue
                log(f"server {address} exited (code {process.returncode}) unplanned")
                self.exits.append(
                    Exit(f"server {address}", self.minute(), process.returncode, False)
                )
                self.planned_down.add(address)
                try:
                    await trio.to_thread.run_sync(
                        lambda s=server: s.start(timeout=SERVER_START_TIMEOUT)  # type: ignore[misc]
                    )
                finally:
                    self.planned_down.discard(address)

    async def sample(self) -> None:
        while True:
            minute = self.minute()
            for address, server in self.servers.items():
                if server.process is not None and server.process.poll() is None:
                    self.rss.append(Sample(f"server {address}", server.pid, minute,
                                           rss_mib(server.pid)))  # fmt: skip
                    for pid in server.children():
                        self.rss.append(Sample(f"host {address}", pid, minute, rss_mib(pid)))
            for agent in self.agents:
                if agent.process.running():
                    pid = agent.process.process.pid  # type: ignore[union-attr]
                    self.rss.append(Sample(f"agent {agent.index}", pid, minute, rss_mib(pid)))
            counts = await trio.to_thread.run_sync(self.count_connections)
            if counts is not None:
                total = sum(counts.values())
                if total > max((n for _, n in self.connections), default=-1):
                    self.connections_at_peak = counts
                self.connections.append((minute, total))
            await trio.sleep(SAMPLE_EVERY)

    def count_connections(self) -> dict[str, int] | None:
        """The cluster's database sessions, by database (the soak's own left out)."""
        names = list(self.bench.url.names.all())
        try:
            with self.store() as conn:
                rows = conn.execute(
                    "SELECT datname, count(*) FROM pg_stat_activity WHERE datname = ANY(%s)"
                    " AND backend_type = 'client backend' AND application_name <> %s"
                    " GROUP BY datname",
                    (names, APP_NAME),
                ).fetchall()
        except psycopg.Error:
            return None
        return {str(name): int(count) for name, count in rows}

    def store(self) -> psycopg.Connection[Any]:
        url = self.bench.url.for_database(self.bench.url.names.main)
        return psycopg.connect(url, autocommit=True, connect_timeout=5, application_name=APP_NAME)

    # --- the end -----------------------------------------------------------------------

    def bounds(self) -> dict[str, float]:
        """Each job's bound (wall clock): the workload's own, or for a job it did not make
        (a schedule's, or one whose answer was lost) one single attempt's."""
        with self.store() as conn:
            rows = conn.execute("SELECT id, extract(epoch FROM created_at) FROM jobs").fetchall()
        found = {}
        for job_id, created in rows:
            known = self.jobs.get(str(job_id))
            if known is not None:
                found[str(job_id)] = known[1] + known[0].bound
            else:
                found[str(job_id)] = float(created) + QUEUE_TIMEOUT + MARGIN + 60.0
        return found

    def unended(self) -> int:
        with self.store() as conn:
            row = conn.execute("SELECT count(*) FROM jobs WHERE ended_at IS NULL").fetchone()
        return int(row[0]) if row else 0

    async def drain(self) -> float:
        """Until every job has ended, or the last bound passed. Seconds it took."""
        began = time.time()
        bounds = await trio.to_thread.run_sync(self.bounds)
        last = max(bounds.values(), default=began)
        while time.time() < last:
            if await trio.to_thread.run_sync(self.unended) == 0:
                break
            await trio.sleep(2.0)
        return time.time() - began

    def records(self) -> Records:
        with self.store() as conn:
            jobs = conn.execute(
                "SELECT id, state, extract(epoch FROM created_at) FROM jobs"
            ).fetchall()
            attempts = conn.execute(
                "SELECT job_id, number, part, node_id, state, exit_code, ended_because, truncated"
                " FROM job_attempts ORDER BY job_id, number"
            ).fetchall()
            digests: dict[tuple[str, int], Any] = defaultdict(hashlib.sha256)
            sizes: Counter[tuple[str, int]] = Counter()
            truncated: set[tuple[str, int]] = set()
            # A named cursor (the output is read in pieces) needs a transaction.
            with conn.transaction(), conn.cursor(name="output") as cursor:
                cursor.execute(
                    "SELECT job_id, attempt, data, truncated FROM job_output"
                    " WHERE stream = 'stdout' ORDER BY job_id, attempt, seq"
                )
                for job_id, attempt, data, cut in cursor:
                    digests[(str(job_id), int(attempt))].update(bytes(data))
                    sizes[(str(job_id), int(attempt))] += len(data)
                    if cut:
                        truncated.add((str(job_id), int(attempt)))
            rows = conn.execute("SELECT action, target FROM audit_log").fetchall()
            audit = {(str(a), str(t)) for a, t in rows}
        bounds = self.bounds()
        listed: dict[str, list[AttemptRecord]] = defaultdict(list)
        empty = hashlib.sha256(b"").hexdigest()
        for job_id, number, part, node, state, code, because, cut in attempts:
            key = (str(job_id), int(number))
            listed[str(job_id)].append(
                AttemptRecord(
                    int(number), int(part), str(node), str(state), code, because,
                    bool(cut) or key in truncated,
                    digests[key].hexdigest() if key in digests else empty, sizes[key],
                )
            )  # fmt: skip
        return Records(
            runs=read_ledger(self.ledger.read()),
            jobs=[
                JobRecord(
                    str(j), str(s), bounds[str(j)], tuple(listed[str(j)]), self.minute(float(c))
                )
                for j, s, c in jobs
            ],
            audit=audit,
            changes=self.changes,
            blocks=self.blocks,
            exits=self.exits,
            rss=self.rss,
            connections=self.connections,
            connection_bound=CONNECTIONS_PER_SERVER * len(self.servers),
            minutes=self.args.minutes,
            checked_at=time.time(),
            started_at=self.started,
        )


def group_of(index: int) -> dict[str, str]:
    return {GROUP_LABEL: str(index % GROUPS)}


def fill(path: Path) -> None:
    """Write zeros to PATH until its file system is full."""
    chunk = b"\0" * (1 << 20)
    with path.open("wb") as out, contextlib.suppress(OSError):
        while True:
            out.write(chunk)
            out.flush()


def connected(agent: AgentProcess) -> bool:
    reported = agent.reported()
    return agent.running() and reported.get("connected") is True and "node_id" in reported


def summary(soak: Soak, records: Records, schedule: list[Fault]) -> dict[str, Any]:
    jobs_by_state = Counter(j.state for j in records.jobs)
    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    states = {j.id: j.state for j in records.jobs}
    for job_id, (job, _) in soak.jobs.items():
        by_kind[job.kind][states.get(job_id, "unknown")] += 1
    moves = Counter(
        str(a.ended_because) for j in records.jobs for a in j.attempts
        if a.ended_because not in (None, "exit")
    )  # fmt: skip
    during = [p.took for p, d in zip(soak.blocks, soak.block_during_fault, strict=True) if d]
    outside = [p.took for p, d in zip(soak.blocks, soak.block_during_fault, strict=True) if not d]
    return {
        "faults": dict(soak.faults_done),
        "faults_skipped": dict(soak.faults_skipped),
        "net_cuts": dict(soak.net_cuts),
        "faults_failed": dict(soak.faults_failed),
        "fault_schedule": [f.to_json() for f in schedule],
        "actions": dict(soak.actions),
        "jobs": dict(jobs_by_state),
        "jobs_by_kind": {k: dict(v) for k, v in by_kind.items()},
        "attempts_ended_other_than_exit": dict(moves),
        "attempts_truncated": sum(a.truncated for j in records.jobs for a in j.attempts),
        "ledger_runs": len(records.runs),
        "changes": len(records.changes),
        "bounds": {
            "block_ms": {
                "during_faults": percentiles([t for t in during if t is not None]),
                "outside_faults": percentiles([t for t in outside if t is not None]),
                "never": sum(t is None for t in during + outside),
                "exempt": [dataclasses.asdict(p) for p in soak.blocks if p.exempt],
                "request_to_answer": percentiles([p.asked for p in soak.blocks]),
                "answer_to_runtime_stopped": percentiles(soak.runtime_stopped),
            },
            "api_ms": {k: percentiles(v) for k, v in soak.api_ms.items()},
        },
        "api_errors": dict(soak.api_errors),
        "db_connections_max": max((n for _, n in soak.connections), default=None),
        "db_connection_bound": records.connection_bound,
        "db_connections_at_peak": soak.connections_at_peak,
        "server_exits": [dataclasses.asdict(e) for e in soak.exits],
    }


async def run(bench: Bench) -> None:
    args = bench.args
    seconds = args.minutes * 60.0
    kinds = tuple(args.faults.split(",")) if args.faults else KINDS
    schedule = plan(args.seed, seconds, len(ADDRESSES), args.agents, kinds=kinds)
    bench.out["seed"] = args.seed
    bench.out["fault_schedule"] = [f.to_json() for f in schedule]
    log(f"seed {args.seed}; fault schedule: {json.dumps(bench.out['fault_schedule'])}")
    with ledger() as made:
        soak = Soak(bench, made)
        bench.progress = soak.progress
        if not await wait_until_servers(bench.files, len(bench.servers)):
            raise Failed("not all servers were up")
        soak.context = Context.load(bench.files.context_path)
        await trio.to_thread.run_sync(soak.start_agents)
        soak.started = time.time()
        soak.ends = soak.started + seconds
        bench.phase[0] = "soak"
        log(f"soak of {args.minutes} minutes with {args.agents} agents begins")
        async with trio.open_nursery() as watchers:
            watchers.start_soon(soak.watch_exits)
            watchers.start_soon(soak.sample)
            async with trio.open_nursery() as work:
                work.start_soon(soak.workload, work)
                work.start_soon(soak.faults, schedule, work)
            bench.phase[0] = "drain"
            log("workload and faults done; waiting for every job to end")
            drained = await soak.drain()
            watchers.cancel_scope.cancel()
        bench.phase[0] = "check"
        records = await trio.to_thread.run_sync(soak.records)
        violations = check(records)
        bench.out.update(summary(soak, records, schedule))
        bench.out["drain_s"] = round(drained, 1)
        bench.out["violations"] = [v.to_json(args.seed) for v in violations]
        log(f"{len(violations)} violations: {json.dumps(bench.out['violations'][:20])}")
        if violations:
            first = violations[0]
            raise Failed(
                f"{len(violations)} violations (seed {args.seed}); first at minute"
                f" {first.minute:.2f}: {first.kind}: {first.detail}"
            )


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=60.0, help="how long faults and work run")
    parser.add_argument("--seed", type=int, default=44)
    parser.add_argument("--agents", type=int, default=100, help="real agents")
    parser.add_argument("--rate", type=float, default=1.0, help="workload actions a second")
    parser.add_argument(
        "--faults", default="", help=f"only these kinds, comma-separated (of {', '.join(KINDS)})"
    )
    parser.add_argument(
        "--actions",
        type=weights,
        default={},
        metavar="KIND=W,...",
        help=f"the workload's weights changed (of {', '.join(ACTIONS)})",
    )


def weights(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    for item in filter(None, text.split(",")):
        kind, _, weight = item.partition("=")
        if kind not in ACTIONS or not weight.isdigit():
            raise argparse.ArgumentTypeError(f"{item!r}: KIND=WEIGHT, KIND one of {list(ACTIONS)}")
        found[kind] = int(weight)
    return found


def check_args(args: argparse.Namespace) -> str | None:
    if args.minutes <= 0 or args.agents < 3 or args.rate <= 0:
        return "need --minutes > 0, --agents >= 3 and --rate > 0"
    unknown = set(filter(None, args.faults.split(","))) - set(KINDS)
    if unknown:
        return f"unknown fault kinds: {sorted(unknown)}"
    hooks = sorted(k for k, w in args.actions.items() if w and k not in MADE)
    if hooks:
        return f"the workload cannot make {hooks} yet (hooks for other branches)"
    return None


SCENARIO = Scenario(
    "soak",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: ADDRESSES,
    check=check_args,
    measured=("oz0", "cli", "oz0_node"),
    private_postgres_port=POSTGRES_PORT,
    # Its faults stop servers; it records every exit itself (planned or not).
    watch_servers=False,
)
