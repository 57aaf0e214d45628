"""The job role's side on the asyncio loop of its portal (role.py runs the Trio side).

temporalio is asyncio-only: the Temporal client and the job workers (one per tenant
namespace on `JOBS_QUEUE`, running the job workflow and its database steps) are made,
swapped and read on that loop only, by `WorkerLoop`; the sweeper reaches them through the
portal (JobsRole). New tenants are picked up within TENANTS_EVERY; the client reconnects
when asked (the server's certificate was renewed), and a call that meets a reconnect is
JobsUnavailable.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from oz0.jobs import heard, inputs, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.schedule_steps import ScheduleSteps
from oz0.jobs.scheduled import ScheduledWorkflow
from oz0.jobs.workflow import JOBS_QUEUE, PARTS_ENDED, JobWorkflow, PartEnd, Placed
from oz0.store.outage import DATABASE_ERRORS
from oz0.store.pool import Database
from oz0.temporal.namespaces import FrontendAccess
from oz0_common import __version__

log = logging.getLogger(__name__)

TENANTS_EVERY = 5.0
CALL_TIMEOUT = 10.0
CONNECT_RETRY_FIRST, CONNECT_RETRY_MAX = 0.5, 5.0
WORKER_SHUTDOWN = 2.0
# How long a stopping worker lets its activities (database steps, milliseconds each) run
# on before it cancels them; within WORKER_SHUTDOWN.
WORKER_GRACE = dt.timedelta(seconds=1)
T = TypeVar("T")
# The sandbox, with our own modules passed through from the worker's: it imports a
# workflow's module afresh for every workflow it runs (to isolate module state), which
# cost a job about a third of its server's CPU (compiling the job workflow each time, py-spy
# of bench.jobs' throughput: servers 75 % → 59 % of a core). Ours hold no state (the
# package oz0/jobs/workflow/, end_reasons.py and scheduled.py import only temporalio, the
# standard library and each other, and keep nothing in module globals:
# tests/test_workflow_modules.py), so one import serves all. The price: the modules they
# import are the real ones, so a call of theirs such as datetime.now() is not refused
# by the sandbox (its guard on the standard library's own modules used through ours); the
# workflows use workflow.now(), workflow.sleep() and workflow.random() only
# (tests/test_job_workflow_lost.py replays their histories).
WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("oz0")
)
# What the histories say ran a workflow task: this release. Given, so that the SDK does not
# make its default, a hash of the code of every module the process has loaded (about 1,400
# of them in a server: 0.1-0.15 CPU-s of every server's start).
BUILD_ID = f"orchestrator-zero {__version__}"


class JobsUnavailable(Exception):
    """The job worker has no Temporal client now (the frontend is not up, or it is
    reconnecting)."""


class WorkerLoop:
    """The Temporal client and the job workers; every method runs on the portal's loop."""

    def __init__(
        self,
        db: Database,
        frontend: Callable[[], FrontendAccess],
        server_id: str,
        activities: JobActivities,
    ) -> None:
        self.db = db
        self.frontend = frontend
        self.server_id = server_id
        # The workflow's steps the workers run.
        self._activities = activities
        self._client: Client | None = None
        self._clients: dict[str, Client] = {}
        self._reconnect: asyncio.Event | None = None
        # Set by a drain: the workers stop for good (the client stays, for the sweeper and
        # the edge, until the role stops); `_drained` once they have.
        self._draining = False
        self._workers = 0
        self._drained: asyncio.Event | None = None
        # Workers being shut down on purpose: their run() returning is no news.
        self._stopping: weakref.WeakSet[Worker] = weakref.WeakSet()

    async def bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        """MAKE(), within CALL_TIMEOUT; JobsUnavailable while not connected."""
        if self._client is None:
            raise JobsUnavailable("the job worker is not connected to Temporal now")
        return await asyncio.wait_for(make(), CALL_TIMEOUT)

    async def bounded_in(
        self, namespace: str, make: Callable[[Client], Awaitable[T]], within: float
    ) -> T:
        """MAKE(a client of NAMESPACE), within WITHIN seconds; JobsUnavailable while not
        connected."""
        if self._client is None:
            raise JobsUnavailable("the job worker is not connected to Temporal now")
        return await asyncio.wait_for(make(self._client_for(namespace)), within)

    def _client_for(self, namespace: str) -> Client:
        client = self._clients.get(namespace)
        if client is None:
            # A reconnect may have begun between the call's check and here.
            if self._client is None:
                raise JobsUnavailable("the job worker is reconnecting to Temporal")
            client = Client(self._client.service_client, namespace=namespace)
            self._clients[namespace] = client
        return client

    def _handle(self, tenant: str, job_id: str) -> WorkflowHandle[Any, Any]:
        return self._client_for(tenant).get_workflow_handle(job_id)

    async def cancel(self, tenant: str, job_id: str) -> None:
        await self._handle(tenant, job_id).cancel()

    async def signal_ends(self, tenant: str, job_id: str, ends: list[PartEnd]) -> None:
        """Tell JOB_ID's workflow that ENDS of its streamed parts came."""
        await self._handle(tenant, job_id).signal(PARTS_ENDED, ends)

    async def signal_removed(self, r: store.Removed) -> None:
        await self._handle(r.tenant, r.job_id).signal("node_removed", args=[r.number, r.because])

    async def start(
        self, job: store.Job, runs: inputs.Everywhere, first: Placed | None = None
    ) -> None:
        eager = False
        with contextlib.suppress(WorkflowAlreadyStartedError):  # another server was first
            handle = await self._client_for(job.tenant).start_workflow(
                JobWorkflow.run,
                inputs.job_input(job, runs, first),
                id=job.id,
                task_queue=JOBS_QUEUE,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                # The first workflow task handed back with the start to this server's own
                # worker of the namespace (on this same client), rather than queued in
                # matching for a poll: a round trip less. Asked only when that worker has a
                # free slot (the SDK reserves it first), and granted only if Temporal
                # allows it; otherwise an ordinary start, which any server's worker takes.
                request_eager_start=True,
            )
            # The SDK's own mark on the handle (not public: read for this log line only).
            eager = bool(getattr(handle, "__temporal_eagerly_started", False))
        log.debug(
            "job %s: workflow started in namespace %s%s",
            job.id,
            job.tenant,
            " (its first task here, eagerly)" if eager else "",
        )

    async def drain(self) -> int:
        """Stop the workers for good (the client serves on); how many there were."""
        self._draining = True
        if self._client is None or self._reconnect is None or self._drained is None:
            return 0  # not connected: no worker runs
        count = self._workers
        self._reconnect.set()
        await asyncio.wait_for(self._drained.wait(), WORKER_SHUTDOWN + 1.0)
        return count

    def reconnect_now(self) -> None:
        if self._reconnect is not None:
            self._reconnect.set()

    async def serve(self) -> None:
        """Connect, run the workers, connect again when asked or when they failed; until
        the portal stops (cancelled)."""
        self._reconnect, self._drained = asyncio.Event(), asyncio.Event()
        delay = CONNECT_RETRY_FIRST
        while True:
            try:
                await self._connect()
            except Exception as e:  # the frontend is not up yet, or restarting
                log.debug("job worker cannot reach Temporal yet: %s", e)
                await asyncio.sleep(delay)
                delay = min(2 * delay, CONNECT_RETRY_MAX)
                continue
            delay = CONNECT_RETRY_FIRST
            self._reconnect.clear()
            try:
                await self._work(self._activities)
                if self._draining:
                    self._drained.set()
                    await asyncio.Event().wait()  # the client serves on until cancelled
            except Exception:  # a bug or a surprise of the SDK's: log it, connect again
                log.exception("the job worker failed; connecting to Temporal again")
                await asyncio.sleep(CONNECT_RETRY_MAX)
            finally:
                self._client, self._clients = None, {}

    async def _connect(self) -> None:
        access = self.frontend()
        client = await asyncio.wait_for(
            Client.connect(
                access.address,
                namespace="default",
                tls=access.tls(),
                identity=f"{self.server_id} jobs",
            ),
            CALL_TIMEOUT,
        )
        self._client, self._clients = client, {}
        log.info("job worker connected to Temporal at %s", access.address)

    async def _work(self, activities: JobActivities) -> None:
        """Run a worker per tenant namespace until asked to reconnect (or cancelled)."""
        assert self._reconnect is not None
        schedule_steps = ScheduleSteps(self.db)
        workers: dict[str, tuple[Worker, asyncio.Task[None]]] = {}
        async with asyncio.TaskGroup() as group:
            try:
                while not self._reconnect.is_set() and not self._draining:
                    try:
                        names = await asyncio.to_thread(self.db.transaction_in_thread, _tenants)
                    except DATABASE_ERRORS:
                        names = list(workers)
                    for name, (_, task) in list(workers.items()):
                        if task.done():  # _run_worker logged why
                            del workers[name]
                    for name in names:
                        if name not in workers:
                            worker = Worker(
                                self._client_for(name),
                                task_queue=JOBS_QUEUE,
                                # Schedules' runs (scheduled.py) beside the jobs.
                                workflows=[JobWorkflow, ScheduledWorkflow],
                                activities=[
                                    *activities.all(),
                                    heard.check_heard,
                                    *schedule_steps.all(),
                                ],
                                identity=f"{self.server_id} jobs",
                                graceful_shutdown_timeout=WORKER_GRACE,
                                workflow_runner=WORKFLOW_RUNNER,
                                build_id=BUILD_ID,
                            )
                            task = group.create_task(self._run_worker(name, worker))
                            workers[name] = (worker, task)
                    self._workers = len(workers)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._reconnect.wait(), TENANTS_EVERY)
            finally:
                # Gracefully first; the group then waits for (or cancels) what remains.
                await asyncio.gather(
                    *(self._shutdown(name, w, t) for name, (w, t) in workers.items())
                )

    async def _run_worker(self, namespace: str, worker: Worker) -> None:
        """Run WORKER; if it dies, say why (the next round starts it again)."""
        try:
            await worker.run()
        except Exception:
            log.exception("job worker for namespace %s died; starting it again", namespace)
        else:
            if worker not in self._stopping:
                log.warning("job worker for namespace %s ended; starting it again", namespace)

    async def _shutdown(self, namespace: str, worker: Worker, task: asyncio.Task[None]) -> None:
        self._stopping.add(worker)
        try:
            await asyncio.wait_for(worker.shutdown(), WORKER_SHUTDOWN)
        except Exception as e:
            log.warning("job worker for namespace %s did not shut down cleanly: %r", namespace, e)
        # A shut-down worker's run() has returned; one that did not shut down in time would
        # hold the task group open, so it is cancelled (a no-op for a finished task).
        task.cancel()


def _tenants(conn: store.Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM tenants ORDER BY name")]
