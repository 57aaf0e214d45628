"""The job role of a server, on Trio: the sweeper, and the portal to the job workers.

- The job workers and their Temporal client run on the asyncio loop of a portal
  (oz0_common/asyncio_portal.py) this role owns: worker_loop.py, reached only through the
  portal. A call that meets a reconnect (or the portal stopping) is JobsUnavailable,
  retried by a later sweep.
- The sweeper, every SWEEP_EVERY and at once when kicked (a job created or
  cancelled through this server, a notification about a node): starts
  the workflow of every job that has none (up to START_AT_ONCE at a time), sends the
  cancellations asked for, and tells each workflow whose attempt's node was blocked,
  purged or deleted (`node_removed`). A kick after a quiet spell sweeps at once; kicks in
  a burst share sweeps, at most one each SWEEP_GAP.
  Every server sweeps, so a server's death delays nothing; what two servers both do is
  harmless (a workflow is started once, a signal heard once).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, TypeVar

import trio
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from oz0 import pki
from oz0.jobs import inputs, parts, secret_env, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.worker_loop import WORKER_SHUTDOWN, JobsUnavailable, WorkerLoop
from oz0.jobs.workflow import Placed
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
# The workers' graceful shutdown, then a margin for the loop's own end.
STOP_WITHIN = WORKER_SHUTDOWN + 3.0
T = TypeVar("T")


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
        self._kicked = trio.Event()
        self._portal: Portal | None = None
        # What runs on the portal's loop: reached only through the portal.
        self._loop = WorkerLoop(db, frontend, server_id, self._activities)

    def kick(self) -> None:
        """Sweep now rather than at the next tick (from the Trio thread)."""
        self._kicked.set()

    def renewed(self) -> None:
        """The server's certificate was renewed: connect again with the new one."""
        portal = self._portal
        if portal is not None:
            with contextlib.suppress(PortalClosed):  # stopping: nothing to reconnect
                portal.call_soon(self._loop.reconnect_now)

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
                stopped = await portal.call(self._loop.drain)
            except (PortalClosed, CallCancelled, TimeoutError) as e:
                log.warning("job workers not stopped gracefully: %r", e)
                return
            log.info(
                "%d job worker(s) stopped in %.2f s: another server's take over",
                stopped,
                time.monotonic() - began,
            )

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # A node's change, or a gap in the news (what changed is unknown): sweep now.
        with self.hub.subscription(NODES, notified=self._node_changed, on_gap=self.kick):
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
            await portal.run("the job worker", self._loop.serve)
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
                        temporal, partial(self._loop.start, job, runs, firsts.get(job.id))
                    ):
                        started.append(job.id)

            async with trio.open_nursery() as nursery:
                for job in claimed:
                    nursery.start_soon(start, job)
            await db.transaction(partial(_mark_started, claimed=claimed, started=started))
        for job_id, tenant in await db.transaction(store.to_cancel):
            if await self._tell_temporal(temporal, partial(self._loop.cancel, tenant, job_id)):
                await db.transaction(partial(store.cancel_sent, job_id=job_id))
        for r in await db.transaction(store.removed_attempts):
            if await self._tell_temporal(temporal, partial(self._loop.signal_removed, r)):
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
            if await self._tell_temporal(temporal, partial(self._loop.signal_removed, removed)):
                log.info("job %s: attempt %d's node was lost; it moves", job_id, number)
                await self.db.transaction(
                    partial(store.removal_signalled, job_id=job_id, number=number)
                )
        for told in untold:
            if await self._tell_temporal(
                temporal, partial(self._loop.signal_ends, told.tenant, told.job_id, told.ends)
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
        return await self._on_loop(self._loop.bounded_in, namespace, make, within)

    async def _call(self, make: Callable[[], Awaitable[T]]) -> T:
        """Run MAKE() on the worker's event loop, within CALL_TIMEOUT; raises as
        `in_namespace` does."""
        return await self._on_loop(self._loop.bounded, make)

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
