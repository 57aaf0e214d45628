"""The job role of a server: its Temporal job worker and the sweeper.

- The worker: one Temporal worker per tenant namespace on `JOBS_QUEUE`, running the job
  workflow and its database steps. temporalio is asyncio-only, so the client and the
  workers live on the loop of an asyncio portal (oz0_common/asyncio_portal.py) this role
  owns: they are made, swapped and read on that loop only, and the sweeper reaches them
  through the portal. New tenants are picked up within TENANTS_EVERY; the client
  reconnects with the server's renewed certificate, and a call that meets a reconnect (or
  the portal stopping) is JobsUnavailable, retried by a later sweep.
- The sweeper (Trio), every SWEEP_EVERY and at once when kicked (a job created or
  cancelled through this server, a notification about a node): starts
  the workflow of every job that has none (up to START_AT_ONCE at a time), sends the
  cancellations asked for, and tells each workflow whose attempt's node was blocked,
  purged or deleted (`node_removed`). A kick after a quiet spell sweeps at once; kicks in
  a burst share sweeps, at most one each SWEEP_GAP.
  Every server sweeps, so a server's death delays nothing; what two servers both do is
  harmless (a workflow is started once, a signal heard once).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import trio
from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from oz0 import pki
from oz0.jobs import heard, inputs, parts, secret_env, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.schedule_steps import ScheduleSteps
from oz0.jobs.scheduled import ScheduledWorkflow
from oz0.jobs.workflow import JOBS_QUEUE, PARTS_ENDED, JobWorkflow, PartEnd, Placed
from oz0.store.events import NODES, EventHub
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database
from oz0.temporal.namespaces import FrontendAccess
from oz0_common.asyncio_portal import CallCancelled, Portal, PortalClosed, asyncio_portal

log = logging.getLogger(__name__)

SWEEP_EVERY = 0.5
# The least time between the starts of two sweeps: kicks in a burst share one sweep, and
# a lone kick is swept at once (no wait for the others of a burst that is not coming).
SWEEP_GAP = 0.02
# Workflows one sweep starts at once: each start is a round trip to Temporal (its history
# written), so a burst of jobs waits for the slowest of a few, not for the sum of them.
START_AT_ONCE = 16
TENANTS_EVERY = 5.0
CALL_TIMEOUT = 10.0
CONNECT_RETRY_FIRST, CONNECT_RETRY_MAX = 0.5, 5.0
WORKER_SHUTDOWN = 2.0
# How long a stopping worker lets its activities (database steps, milliseconds each) run
# on before it cancels them; within WORKER_SHUTDOWN.
WORKER_GRACE = dt.timedelta(seconds=1)
# The workers' graceful shutdown, then a margin for the loop's own end.
STOP_WITHIN = WORKER_SHUTDOWN + 3.0
T = TypeVar("T")
# The sandbox, with our own modules passed through from the worker's: it imports a
# workflow's module afresh for every workflow it runs (to isolate module state), which
# cost a job about a third of its server's CPU (compiling the job workflow each time, py-spy
# of bench.jobs' throughput: servers 75 % → 59 % of a core). Ours hold no state (the
# package oz0/jobs/workflow/, end_reasons.py and scheduled.py import only temporalio, the
# standard library and each other, and keep nothing in module globals:
# tests/test_workflow_modules.py), so one import serves all. The price: the modules they
# import are the real ones, so a call of theirs such as datetime.now() is no longer refused
# by the sandbox (its guard on the standard library's own modules used through ours); the
# workflows use workflow.now(), workflow.sleep() and workflow.random() only
# (tests/test_job_workflow.py replays their histories).
WORKFLOW_RUNNER = SandboxedWorkflowRunner(
    restrictions=SandboxRestrictions.default.with_passthrough_modules("oz0")
)


class JobsUnavailable(Exception):
    """The job worker has no Temporal client now (the frontend is not up, or it is
    reconnecting)."""


class JobsRole:
    def __init__(
        self,
        db: Database,
        hub: EventHub,
        frontend: Callable[[], FrontendAccess],
        server_id: str,
        *,
        ca: pki.CertificateAuthority,
        keeper: secret_env.SecretKeeper | None = None,
        on_ended: Callable[[str, store.JobTimes], None] | None = None,
    ) -> None:
        self.db = db
        # The cluster CA: it signs each attempt placed (grant.py).
        self.ca = ca
        # Seals jobs' secrets to the nodes their attempts are placed on (activities.py).
        self.keeper = keeper
        # The workflow's steps (the job workers'), and the sweeper's placing of a job's
        # first attempt as it claims the job. ON_ENDED: told of each job they end.
        self._activities = JobActivities(db, AttemptSigner(ca), keeper, on_ended)
        self.hub = hub
        self.frontend = frontend
        self.server_id = server_id
        self._kicked = trio.Event()
        self._portal: Portal | None = None
        # The asyncio side's own: made, swapped and read on the portal's loop only.
        self._client: Client | None = None
        self._clients: dict[str, Client] = {}
        self._reconnect: asyncio.Event | None = None
        # Set by a drain: the workers stop for good (the client stays, for the sweeper and
        # the edge, until the role stops); `_drained` once they have.
        self._draining = False
        self._workers = 0
        self._drained: asyncio.Event | None = None

    # --- Trio side -----------------------------------------------------------------------

    def kick(self) -> None:
        """Sweep now rather than at the next tick (from the Trio thread)."""
        self._kicked.set()

    def renewed(self) -> None:
        """The server's certificate was renewed: connect again with the new one."""
        portal = self._portal
        if portal is not None:
            with contextlib.suppress(PortalClosed):  # stopping: nothing to reconnect
                portal.call_soon(self._reconnect_now)

    async def drain(self) -> None:
        """Stop the job workers gracefully while Temporal still runs under them (a server's
        drain, before its roles stop): each finishes the workflow tasks and database steps
        it has and gives up its sticky queue, so another server's worker takes each
        workflow's next step at once. At most WORKER_SHUTDOWN and a margin."""
        portal = self._portal
        if portal is None:
            return
        began = time.monotonic()
        with trio.move_on_after(STOP_WITHIN):
            try:
                stopped = await portal.call(self._drain_workers)
            except (PortalClosed, CallCancelled, TimeoutError) as e:
                log.warning("job workers not stopped gracefully: %r", e)
                return
            log.info(
                "%d job worker(s) stopped in %.2f s: another server's take over",
                stopped,
                time.monotonic() - began,
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.hub.subscribe(NODES, self._node_changed)
        self.hub.on_gap.append(self.kick)
        async with asyncio_portal("oz0-jobs", stop_within=STOP_WITHIN) as portal:
            self._portal = portal
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._worker, portal)
                    task_status.started()
                    await self._sweep_forever()
            finally:
                self._portal = None

    async def _worker(self, portal: Portal) -> None:
        try:
            await portal.run("the job worker", self._serve)
        except Exception:  # logged with its traceback by the portal; the sweeper goes on
            log.error("the job worker has stopped: this server starts no job workflow")

    def _node_changed(self, notification: Notification) -> None:
        # Only a change of state, tenant or key notifies: rare enough to sweep for each.
        self.kick()

    async def _sweep_forever(self) -> None:
        outage = Outage("the job sweeper's database access", log)
        temporal = Outage("the job sweeper's calls to Temporal", log)
        last = -SWEEP_GAP
        while True:
            with trio.move_on_after(SWEEP_EVERY):
                await self._kicked.wait()
            await trio.sleep_until(last + SWEEP_GAP)  # kicks in a burst share one sweep
            self._kicked = trio.Event()
            last = trio.current_time()
            try:
                await self.sweep(temporal)
            except DATABASE_ERRORS as e:
                await trio.sleep(outage.failed(e))
                continue
            outage.worked()

    async def sweep(self, temporal: Outage) -> None:
        db = self.db
        claimed, runs, firsts = await db.transaction(
            partial(claim_for_start, placer=self._activities)
        )
        if claimed:
            started: list[str] = []
            limiter = trio.CapacityLimiter(START_AT_ONCE)

            async def start(job: store.Job) -> None:
                async with limiter:
                    if await self._tell_temporal(
                        temporal, partial(self._start, job, runs, firsts.get(job.id))
                    ):
                        started.append(job.id)

            async with trio.open_nursery() as nursery:
                for job in claimed:
                    nursery.start_soon(start, job)
            await db.transaction(partial(_mark_started, claimed=claimed, started=started))
        for job_id, tenant in await db.transaction(store.to_cancel):
            if await self._tell_temporal(temporal, partial(self._cancel, tenant, job_id)):
                await db.transaction(partial(store.cancel_sent, job_id=job_id))
        for r in await db.transaction(store.removed_attempts):
            if await self._tell_temporal(temporal, partial(self._signal_removed, r)):
                log.info(
                    "job %s: attempt %d moves off its node (%s)", r.job_id, r.number, r.because
                )
                await db.transaction(
                    partial(store.removal_signalled, job_id=r.job_id, number=r.number)
                )
        await self._sweep_parts(temporal)

    async def _sweep_parts(self, temporal: Outage) -> None:
        """Streamed parts (parts.py): those whose node fell silent for their lost-after
        move as a removed node's do; ends an edge recorded but could not signal are told."""
        silent, untold, overdue = await self.db.transaction(
            lambda conn: (
                parts.silent_parts(conn), parts.unsignalled_ends(conn), parts.overdue_parts(conn)
            )
        )  # fmt: skip
        if overdue:
            untold += await self.db.transaction(partial(parts.end_overdue, reports=overdue))
        for job_id, tenant, number in silent:
            removed = store.Removed(job_id, tenant, number, EndReason.NODE_LOST)
            if await self._tell_temporal(temporal, partial(self._signal_removed, removed)):
                log.info("job %s: attempt %d's node was lost; it moves", job_id, number)
                await self.db.transaction(
                    partial(store.removal_signalled, job_id=job_id, number=number)
                )
        for told in untold:
            if await self._tell_temporal(
                temporal, partial(self.signal_ends, told.tenant, told.job_id, told.ends)
            ):
                keys = [(told.job_id, end.number) for end in told.ends]
                await self.db.transaction(partial(parts.ends_signalled, keys=keys))

    async def _tell_temporal(self, temporal: Outage, call: Callable[[], Awaitable[None]]) -> bool:
        """Make CALL on the worker's loop; False (logged once per outage) if it failed.
        A workflow that is gone (NOT_FOUND) needs telling no more: True."""
        try:
            await self._call(call)
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                temporal.failed(e)
                return False
        except (JobsUnavailable, TimeoutError) as e:
            temporal.failed(e)
            return False
        temporal.worked()
        return True

    async def in_namespace(
        self, namespace: str, make: Callable[[Client], Awaitable[T]], within: float
    ) -> T:
        """MAKE(a client of NAMESPACE on the worker's connection), run on the worker's
        event loop within WITHIN seconds (the edge's calls for nodes' attempts, edge/attempts.py).
        JobsUnavailable while not connected or while the loop stops; TimeoutError past
        WITHIN; what MAKE raises (temporalio's RPCError, say) as it is."""
        return await self._on_loop(self._bounded_in, namespace, make, within)

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run MAKE() on the worker's event loop, within CALL_TIMEOUT; raises as
        `in_namespace` does."""
        return await self._on_loop(self._bounded, make)

    async def _on_loop(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`await FN(*ARGS)` on the worker's loop. The portal's own errors (its loop not
        running, the call cancelled there as it stops) are JobsUnavailable: the callers
        need not know the portal, only that the job worker could not make the call."""
        portal = self._portal
        if portal is None:
            raise JobsUnavailable("the job worker is not running")
        try:
            return await portal.call(fn, *args)
        except (CallCancelled, PortalClosed) as e:
            raise JobsUnavailable(f"the job worker's event loop is stopping: {e}") from e

    # --- on the portal's asyncio loop --------------------------------------------------

    async def _bounded(self, make: Callable[[], Awaitable[T]]) -> T:
        if self._client is None:
            raise JobsUnavailable("the job worker is not connected to Temporal now")
        return await asyncio.wait_for(make(), CALL_TIMEOUT)

    async def _bounded_in(
        self, namespace: str, make: Callable[[Client], Awaitable[T]], within: float
    ) -> T:
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

    async def _cancel(self, tenant: str, job_id: str) -> None:
        await self._handle(tenant, job_id).cancel()

    async def signal_ends(self, tenant: str, job_id: str, ends: list[PartEnd]) -> None:
        """Tell JOB_ID's workflow that ENDS of its streamed parts came (on the worker's
        loop: through `_tell_temporal`, or the edge's `in_namespace`)."""
        await self._handle(tenant, job_id).signal(PARTS_ENDED, ends)

    async def _signal_removed(self, r: store.Removed) -> None:
        await self._handle(r.tenant, r.job_id).signal("node_removed", args=[r.number, r.because])

    async def _start(
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

    async def _drain_workers(self) -> int:
        self._draining = True
        if self._client is None or self._reconnect is None or self._drained is None:
            return 0  # not connected: no worker runs
        count = self._workers
        self._reconnect.set()
        await asyncio.wait_for(self._drained.wait(), WORKER_SHUTDOWN + 1.0)
        return count

    def _reconnect_now(self) -> None:
        if self._reconnect is not None:
            self._reconnect.set()

    async def _serve(self) -> None:
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
                            )
                            task = group.create_task(_run_worker(name, worker))
                            workers[name] = (worker, task)
                    self._workers = len(workers)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._reconnect.wait(), TENANTS_EVERY)
            finally:
                # Gracefully first; the group then waits for (or cancels) what remains.
                await asyncio.gather(*(_shutdown(name, w, t) for name, (w, t) in workers.items()))


async def _run_worker(namespace: str, worker: Worker) -> None:
    """Run WORKER; if it dies, say why (the next round starts it again)."""
    try:
        await worker.run()
    except Exception:
        log.exception("job worker for namespace %s died; starting it again", namespace)
    else:
        if worker not in _STOPPING:
            log.warning("job worker for namespace %s ended; starting it again", namespace)


# Workers being shut down on purpose: their run() returning is no news.
_STOPPING: weakref.WeakSet[Worker] = weakref.WeakSet()


async def _shutdown(namespace: str, worker: Worker, task: asyncio.Task[None]) -> None:
    _STOPPING.add(worker)
    try:
        await asyncio.wait_for(worker.shutdown(), WORKER_SHUTDOWN)
    except Exception as e:
        log.warning("job worker for namespace %s did not shut down cleanly: %r", namespace, e)
    # A shut-down worker's run() has returned; one that did not shut down in time would
    # hold the task group open, so it is cancelled (a no-op for a finished task).
    task.cancel()


def claim_for_start(
    conn: store.Conn, placer: JobActivities
) -> tuple[list[store.Job], inputs.Everywhere, dict[str, Placed | None]]:
    """The jobs this sweep starts, what their workflows may run (inputs.py), and the first
    attempt of each that PLACER placed now (JobActivities.first_placed: its workflow hands
    it out in its first task); one transaction."""
    claimed = store.claim_unstarted(conn)
    if not claimed:
        return claimed, inputs.Everywhere(local_steps=False, watch_heard=False), {}
    runs = inputs.everywhere(conn)
    claimed = inputs.streaming(conn, claimed, runs)
    firsts = {
        job.id: placer.first_placed(conn, job) if runs.first_placed else None for job in claimed
    }
    return claimed, runs, firsts


def _mark_started(conn: store.Conn, claimed: list[store.Job], started: list[str]) -> None:
    """Each of CLAIMED started if in STARTED, else its claim let go (a later sweep, of any
    server, starts it)."""
    for job in claimed:
        if job.id in started:
            store.started(conn, job.id)
        else:
            store.release_claim(conn, job.id)


def _tenants(conn: store.Conn) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM tenants ORDER BY name")]
