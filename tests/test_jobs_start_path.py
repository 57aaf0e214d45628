"""How the job role's sweeper starts workflows (oz0/jobs/role.py), against a real Temporal
(one server on 127.0.0.188) and a real database: at once when kicked, several at a time,
and eagerly (the first workflow task handed back with the start, to this server's own
worker) when that worker polls the tenant's namespace.

The role under test runs in this process on a database of its own (a second cluster's,
never served, so no server sweeps its jobs: fixtures/jobs_role.py). Fakes only inject
faults: a start made slow (as a loaded Temporal makes it), a tenant whose worker this
server has not started yet, and, for the sweeper's pacing alone, a sweep that only notes
when it ran (on Trio's mock clock).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, cast

import psycopg
import pytest
import trio
import trio.testing
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from fixtures.jobs_role import role_cluster
from fixtures.temporal import Credentials, run_async
from oz0 import audit, pki
from oz0.jobs import inputs, store, worker_loop
from oz0.jobs import role as role_module
from oz0.jobs.role import SWEEP_EVERY, SWEEP_GAP, JobsRole
from oz0.jobs.spec import JobSpec
from oz0.jobs.worker_loop import WorkerLoop
from oz0.jobs.workflow import Placed
from oz0.store.events import EventHub
from oz0.store.outage import Outage
from oz0.store.pool import Database, open_database
from oz0.temporal.namespaces import FrontendAccess

SERVER = "127.0.0.188"
TEMPORAL = f"{SERVER}:7233"
TENANT = "starts"
# A tenant whose namespace this server's job worker does not poll yet (`hidden`).
LATE = "starts-late"
BOUND = 60.0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Credentials, str]]:
    """A running server (its Temporal), and the database of the role under test: a second
    cluster's, holding tenants TENANT and LATE, whose namespaces the server's Temporal has."""
    root = tmp_path_factory.mktemp("jobs-start-path")
    with role_cluster(root, SERVER, [TENANT, LATE]) as both:
        yield both


def _new_jobs(conninfo: str, count: int, tenant: str = TENANT) -> list[str]:
    with psycopg.connect(conninfo) as conn:
        return [
            store.create(
                conn, JobSpec(tenant=tenant, command=["true"]), audit.Actor("operator", "test")
            ).id
            for _ in range(count)
        ]


def _unstarted(conninfo: str, job_ids: list[str]) -> set[str]:
    with psycopg.connect(conninfo) as conn:
        rows = conn.execute(
            "SELECT id FROM jobs WHERE id = ANY(%s) AND NOT workflow_started", (job_ids,)
        ).fetchall()
    return {r[0] for r in rows}


async def _wait_started(conninfo: str, job_ids: list[str]) -> None:
    # The database says when; nothing else tells this process.
    while await trio.to_thread.run_sync(_unstarted, conninfo, job_ids):  # noqa: ASYNC110
        await trio.sleep(0.05)


@dataclass
class Started:
    """What Temporal kept of a job's workflow: its history, and the request IDs that made it
    (the start's, as DescribeWorkflowExecution lists them)."""

    events: list[HistoryEvent]
    start_requests: set[str]

    def eager(self) -> bool:
        """Whether the first workflow task was handed out with the start: an eager start
        writes that task started with the start's own request ID; otherwise a worker's poll
        took it from matching later, with the poll's."""
        scheduled, taken = self.events[1], self.events[2]
        assert scheduled.HasField("workflow_task_scheduled_event_attributes")
        assert taken.HasField("workflow_task_started_event_attributes")
        return taken.workflow_task_started_event_attributes.request_id in self.start_requests


def _history(creds: Credentials, namespace: str, job_id: str) -> Started:
    async def fetch() -> Started:
        client = await Client.connect(TEMPORAL, namespace=namespace, tls=creds.tls())
        handle = client.get_workflow_handle(job_id)
        history = await handle.fetch_history()
        described = await handle.describe()
        infos = described.raw_description.workflow_extended_info.request_id_infos
        return Started(list(history.events), set(infos))

    return run_async(fetch)


async def _first_task_done(
    creds: Credentials, conninfo: str, namespace: str, job_id: str
) -> Started:
    """JOB_ID's workflow once its first workflow task has completed (a worker ran it)."""
    await _wait_started(conninfo, [job_id])
    while True:
        started = await trio.to_thread.run_sync(_history, creds, namespace, job_id)
        if any(e.HasField("workflow_task_completed_event_attributes") for e in started.events):
            return started
        await trio.sleep(0.1)


def _role(conninfo: str, db: Database, creds: Credentials, name: str) -> JobsRole:
    access = FrontendAccess(TEMPORAL, creds.ca_pem, creds.cert_pem, creds.key_pem)
    return JobsRole(
        db, EventHub(conninfo), lambda: access, name,
        ca=pki.new_ca(name, "cluster"),  # it signs; no node checks
    )  # fmt: skip


async def test_a_burst_of_jobs_is_started_several_at_a_time(
    cluster: tuple[Credentials, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault: every start takes SLOW longer. Jobs claimed in one sweep are started
    AT_ONCE at a time, not one after another, and each is marked started."""
    creds, conninfo = cluster
    at_once, slow, count = 3, 1.0, 7
    monkeypatch.setattr(role_module, "START_AT_ONCE", at_once)
    real_start = WorkerLoop.start
    running: list[int] = [0]
    most: list[int] = [0]

    async def slow_start(
        self: WorkerLoop, job: store.Job, runs: inputs.Everywhere, first: Placed | None = None
    ) -> None:
        running[0] += 1  # on the role's one asyncio loop: no lock needed
        most[0] = max(most[0], running[0])
        try:
            await asyncio.sleep(slow)
            await real_start(self, job, runs, first)
        finally:
            running[0] -= 1

    monkeypatch.setattr(WorkerLoop, "start", slow_start)
    # Made before the role runs: its first sweep once connected claims them all at once.
    jobs = await trio.to_thread.run_sync(_new_jobs, conninfo, count)
    with trio.fail_after(BOUND):
        async with open_database(conninfo) as db, trio.open_nursery() as nursery:
            await nursery.start(_role(conninfo, db, creds, "server-burst-test").run)
            await _wait_started(conninfo, jobs)
            nursery.cancel_scope.cancel()
    assert most[0] == at_once, "starts in a burst run several at a time, at most START_AT_ONCE"


async def test_the_first_workflow_task_is_eager_where_this_server_runs_the_worker(
    cluster: tuple[Credentials, str],
) -> None:
    creds, conninfo = cluster
    with trio.fail_after(BOUND):
        async with open_database(conninfo) as db, trio.open_nursery() as nursery:
            role = _role(conninfo, db, creds, "server-eager-test")
            await nursery.start(role.run)
            # A first job shows the role's worker polling TENANT's namespace.
            [first] = await trio.to_thread.run_sync(_new_jobs, conninfo, 1)
            role.kick()
            await _first_task_done(creds, conninfo, TENANT, first)
            [job] = await trio.to_thread.run_sync(_new_jobs, conninfo, 1)
            role.kick()
            started = await _first_task_done(creds, conninfo, TENANT, job)
            nursery.cancel_scope.cancel()
    assert started.eager(), started.events[:3]
    taken = started.events[2].workflow_task_started_event_attributes
    assert taken.identity == "server-eager-test jobs", "run by the worker that started it"


async def test_a_job_starts_when_no_worker_here_can_take_it_eagerly(
    cluster: tuple[Credentials, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault: this server's worker does not poll LATE's namespace yet (a tenant made
    since its last look), so no eager start can be made there: the workflow is started
    anyway, and its first task waits for a worker, which takes it once it comes."""
    creds, conninfo = cluster
    hidden = trio.Event()  # set: the worker may see LATE
    real_tenants = worker_loop._tenants

    def tenants(conn: store.Conn) -> list[str]:
        return [t for t in real_tenants(conn) if t != LATE or hidden.is_set()]

    monkeypatch.setattr(worker_loop, "_tenants", tenants)
    monkeypatch.setattr(worker_loop, "TENANTS_EVERY", 0.2)
    with trio.fail_after(BOUND):
        async with open_database(conninfo) as db, trio.open_nursery() as nursery:
            role = _role(conninfo, db, creds, "server-not-eager-test")
            await nursery.start(role.run)
            [job] = await trio.to_thread.run_sync(_new_jobs, conninfo, 1, LATE)
            role.kick()
            await _wait_started(conninfo, [job])
            before = await trio.to_thread.run_sync(_history, creds, LATE, job)
            assert not any(
                e.HasField("workflow_task_started_event_attributes") for e in before.events
            ), "no worker took the first task yet"
            hidden.set()
            started = await _first_task_done(creds, conninfo, LATE, job)
            nursery.cancel_scope.cancel()
    assert started.start_requests, "Temporal lists the start's request ID"
    assert not started.eager()


async def test_a_lone_kick_sweeps_at_once_and_a_burst_of_kicks_shares_sweeps(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweeper's pacing alone (its sweeps replaced by a note of when each began): a
    kick after a quiet spell is swept at that instant; kicks that come during a sweep
    share the next, SWEEP_GAP after the last began; with no kick, one each SWEEP_EVERY."""
    role = JobsRole(
        cast(Any, None), cast(Any, None), cast(Any, None), "pacing",
        ca=cast(Any, None),
    )  # fmt: skip
    began: list[float] = []

    async def sweep(temporal: Outage) -> None:
        began.append(trio.current_time())
        if len(began) == 2:  # a burst: kicks while this sweep runs
            for _ in range(5):
                role.kick()
                await trio.sleep(0.001)

    monkeypatch.setattr(role, "sweep", sweep)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            start = trio.current_time()
            nursery.start_soon(role._sweep_forever)
            await trio.sleep(SWEEP_EVERY + 0.2)
            role.kick()  # a lone kick, long after the last sweep
            await trio.sleep(SWEEP_EVERY - 0.1)
            nursery.cancel_scope.cancel()
    at = [round(t - start, 6) for t in began]
    lone = SWEEP_EVERY + 0.2
    assert at == [SWEEP_EVERY, lone, round(lone + SWEEP_GAP, 6)]
