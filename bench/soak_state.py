"""The soak's shared state (issue 44): where its cluster listens, what it has done so far
(the jobs and changes it made, the blocks it probed, the faults it injected, the samples
it took), and its way to the management API of the three servers in turn. The soak's
parts (bench/soak_*.py) each read and add to one Soak; bench/scenarios/soak.py runs them.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psycopg
import trio

from bench.runner import Bench
from bench.soak_faults import Fault
from bench.soak_ledger import Ledger
from bench.soak_model import BlockProbe, Change, Exit, FaultSpan, HostExit, PushRecord, Sample
from bench.soak_workload import JobPlan
from cli.client import ApiClient, ApiError
from fixtures.cluster import ServerProcess
from oz0.context import MANAGEMENT_PORT, Context
from oz0_common.addresses import EDGE_PORT

if TYPE_CHECKING:
    from bench.soak_fleet import Fleet
    from bench.soak_sessions import Seen

ADDRESSES = ("127.0.0.44", "127.0.0.45", "127.0.0.46")
EDGES = [f"{address}:{EDGE_PORT}" for address in ADDRESSES]
POSTGRES_PORT = 5444
# The network namespaces of the agents cut off (README: .47-.50 are the soak's).
NAMESPACES = (47, 48, 49, 50)
APP_NAME = "oz0-soak"  # the soak's own database sessions, not counted as the cluster's
SERVER_START_TIMEOUT = 180.0
API_THREADS = 16


class Failed(Exception):
    """The soak could not go on (not a violation: the cluster is not judged by it)."""


@dataclass(eq=False)
class Soak:
    bench: Bench
    ledger: Ledger
    fleet: Fleet
    started: float = 0.0
    ends: float = 0.0
    context: Context | None = None
    api_turn: int = 0
    # What the workload made, by job ID: its plan, when it was sent (wall clock).
    jobs: dict[str, tuple[JobPlan, float]] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    blocks: list[BlockProbe] = field(default_factory=list)
    # Each push's nodes, their files read back after it ended.
    pushes: list[PushRecord] = field(default_factory=list)
    # Per push, a node not read back (its agent purged since), and why.
    pushes_unread: Counter[str] = field(default_factory=Counter)
    # Each session as the soak saw it over its websocket.
    sessions: list[Seen] = field(default_factory=list)
    block_during_fault: list[bool] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    # Temporal hosts seen gone while their server ran on; the PIDs of each server's now.
    host_exits: list[HostExit] = field(default_factory=list)
    hosts: dict[str, set[int]] = field(default_factory=dict)
    # The faults injected, once each has ended (the checker explains host exits by them).
    fault_spans: list[FaultSpan] = field(default_factory=list)
    rss: list[Sample] = field(default_factory=list)
    connections: list[tuple[float, int]] = field(default_factory=list)
    connections_at_peak: dict[str, int] = field(default_factory=dict)
    api_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    api_errors: Counter[str] = field(default_factory=Counter)
    faults_done: Counter[str] = field(default_factory=Counter)
    faults_skipped: Counter[str] = field(default_factory=Counter)
    net_cuts: Counter[str] = field(default_factory=Counter)
    faults_failed: Counter[str] = field(default_factory=Counter)
    # Why a block's Temporal probe could not run (bench/soak_probe.py), each time.
    probe_failures: list[str] = field(default_factory=list)
    # After each block's answer, the seconds until its node's runtime stopped.
    runtime_stopped: list[float] = field(default_factory=list)
    active: list[Fault] = field(default_factory=list)
    # Servers a fault has taken down on purpose (by address).
    planned_down: set[str] = field(default_factory=set)
    actions: Counter[str] = field(default_factory=Counter)
    people: int = 0
    schedule_id: str | None = None
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

    def stopped_servers(self) -> set[str]:
        """The servers (by address) a fault has stopped or paused now."""
        stopping = ("server_kill", "server_term", "server_pause")
        return {ADDRESSES[f.target] for f in self.active if f.kind in stopping}

    def temporal_disturbed(self, since: float) -> set[str]:
        """The servers (by address) whose Temporal a fault has stopped, paused or killed
        at some time from the wall clock SINCE to now (its Temporal cannot be judged)."""
        kinds = ("server_kill", "server_term", "server_pause", "temporal_host_kill")
        found = {ADDRESSES[f.target] for f in self.active if f.kind in kinds}
        after = self.minute(since)
        found |= {s.target for s in self.fault_spans if s.kind in kinds and s.end >= after}
        return found

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

    # --- the store (read by the soak itself, under a name of its own) -------------------

    def store(self) -> psycopg.Connection[Any]:
        url = self.bench.url.for_database(self.bench.url.names.main)
        return psycopg.connect(url, autocommit=True, connect_timeout=5, application_name=APP_NAME)

    def server_address(self, server_id: object) -> str | None:
        with self.store() as conn:
            row = conn.execute(
                "SELECT advertise FROM servers WHERE id = %s", (str(server_id),)
            ).fetchone()
        return str(row[0]) if row else None
