"""The node's runtime: a Temporal worker on the node's own task queue, named its node ID.

It runs while the node is accepted and connected: started once a control stream is
welcomed (the welcome names the Temporal frontend and the tenant), stopped when that stream
ends for any reason (refused, purge, edge lost, SIGTERM). It connects with the node's own
certificate, verifies the frontend against the pinned cluster CA, and works in the namespace
of the node's tenant. It offers the agent's built-in activities only (no workflows):
`oz0.node.describe`, and `oz0.job.attempt` (oz0_node/jobs/) when the agent has an attempt
manager; that one takes only attempts whose grant holds (jobs/grants.py), checked against
the cluster CA pinned in the node's identity and the cluster and tenant below, and hands
them to the manager: the attempts are the agent's, not the runtime's, and run on when it
stops (a server's restart, a move to another edge).

temporalio is asyncio-only: the Client and the Worker are made and run on the loop of an
asyncio portal (oz0_common/asyncio_portal.py) that run() owns. Stopping is bounded: the
worker is shut down, not cancelled (activities get GRACEFUL_SHUTDOWN), within WORKER_STOP,
then the portal's thread is waited for, all within STOP_TIMEOUT; a thread that outlives it
is logged and left behind as a daemon, never holding up the agent's exit. The shutdown
must run to its end: a worker whose shutdown is cut short never frees what temporalio's
core holds for it (about half a MiB, measured), and an agent makes a runtime for every
control stream and every retry on one, so its memory grew with every reconnect.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import os
import platform
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import trio
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from oz0_common import __version__, certs
from oz0_common.asyncio_portal import (
    CallCancelled,
    Portal,
    PortalClosed,
    PortalStuck,
    TrioPortal,
    asyncio_portal,
)
from oz0_common.temporal_tls import tls_from_files
from oz0_node import plugins
from oz0_node.identity import DEFAULT_MAX_JOBS, IdentityDir
from oz0_node.jobs.attempt import AttemptPort, attempt_activity
from oz0_node.jobs.grants import GrantCheck, RunRecord
from oz0_node.jobs.intake import Intake
from oz0_node.jobs.manager import AttemptManager

log = logging.getLogger(__name__)

DESCRIBE_ACTIVITY = "oz0.node.describe"
# A node runs what it is given next to its owner's work: keep the worker small. Its
# attempts' activities only hand them over (then complete asynchronously), each waiting
# while the manager has no free slot: the worker takes as many at once as the manager runs
# (`--max-jobs`), so none waits on the worker instead.
MAX_CONCURRENT_ACTIVITIES = DEFAULT_MAX_JOBS
CONNECT_TIMEOUT = 10.0
GRACEFUL_SHUTDOWN = dt.timedelta(seconds=1)
# Heartbeats reach Temporal at least this often, so a cancellation reaches an attempt
# (it comes back in a heartbeat's answer) within about this long.
HEARTBEAT_THROTTLE = dt.timedelta(seconds=1)
# The worker's graceful shutdown, then a margin for its core to finish.
WORKER_STOP = GRACEFUL_SHUTDOWN.total_seconds() + 0.5
# What the portal has after the worker shut down (nothing, unless that shutdown overran
# WORKER_STOP and the worker is cancelled instead).
PORTAL_STOP = 1.5
STOP_TIMEOUT = WORKER_STOP + PORTAL_STOP
RUNNING_POLL = 0.05
# What the histories say took an attempt's activity: this release of the agent. Given, so
# that the SDK does not make its default, a hash of the code of every module the agent has
# loaded (0.05-0.1 CPU-s of every agent's start).
BUILD_ID = f"oz0-node {__version__}"


def task_queue(node_id: str) -> str:
    """The queue of work meant for this node, and no other: its node ID (`node-<hex>`),
    the one queue Temporal lets this node's certificate poll."""
    return node_id


@dataclass(frozen=True)
class RuntimeSettings:
    node_id: str
    namespace: str  # the node's tenant
    temporal: str  # HOST:PORT of a Temporal frontend
    identity: IdentityDir
    cluster: str  # the cluster the node joined: its attempts' grants must name it
    # Who takes the attempts (the agent's attempt manager). Without one the runtime
    # offers no job activity.
    attempts: AttemptPort | None = None
    # How many activities the worker takes at once (the manager's max_running).
    max_activities: int = MAX_CONCURRENT_ACTIVITIES
    # The agent's record of the attempts it ran, shared with its streams' intake (None:
    # read from the identity's directory).
    record: RunRecord | None = None

    @property
    def task_queue(self) -> str:
        return task_queue(self.node_id)


class RuntimeFailed(Exception):
    """The runtime could not start, or its worker failed: try again later."""


class Runtime(Protocol):
    async def run(self, running: Callable[[], None]) -> None:
        """Run until cancelled (then stop, bounded); RUNNING is called once it works.

        Raises RuntimeFailed when it cannot start or its worker fails."""

    async def stop(self) -> None:
        """Stop it if it still runs, waiting at most STOP_TIMEOUT; safe to repeat."""


RuntimeFactory = Callable[[RuntimeSettings], Runtime]


def describe_activity(node_id: str) -> Callable[[], Any]:
    """`oz0.node.describe`: who and what this node is, for operators and diagnostics."""

    @activity.defn(name=DESCRIBE_ACTIVITY)
    async def describe() -> dict[str, object]:
        return {
            "node_id": node_id,
            "hostname": socket.gethostname(),
            # The cluster keeps the node's labels; the node itself does not know them.
            "labels": {},
            "agent_version": __version__,
            "platform": platform.platform(),
        }

    return describe


def grant_check(settings: RuntimeSettings) -> GrantCheck:
    """How this runtime's attempts are checked: against the cluster CA the node pinned at
    its join, its cluster, its tenant (the namespace) and its node ID."""
    return GrantCheck(
        cluster=settings.cluster,
        tenant=settings.namespace,
        node_id=settings.node_id,
        ca=certs.cert_from_pem(settings.identity.load_ca_pem()),
        record=(
            settings.record
            if settings.record is not None
            else RunRecord.load(settings.identity.data_dir)
        ),
    )


# Each runtime of this process, numbered: its Temporal identity says which took a task.
_runtime_numbers = itertools.count(1)


class NodeRuntime:
    """One worker on one asyncio portal, for one control stream."""

    def __init__(self, settings: RuntimeSettings) -> None:
        self.settings = settings
        self.number = next(_runtime_numbers)
        # The Trio side's own.
        self._started = False
        self._stopping = False
        self._stop_scope: trio.CancelScope | None = None
        self._ended = trio.Event()
        # The asyncio side's: the worker, once made (read from Trio once the portal ended).
        self._worker: Worker | None = None

    @property
    def worker_finished(self) -> bool | None:
        """Whether its worker's shutdown ran to its end, freeing what temporalio's core
        held for it (None: it made no worker)."""
        return None if self._worker is None else self._worker.is_shutdown

    @property
    def thread_name(self) -> str:
        return f"oz0-runtime-{self.settings.node_id}"

    async def run(self, running: Callable[[], None]) -> None:
        # How the worker's side (the portal's loop) reports back: RUNNING is Trio's.
        to_trio = TrioPortal(self.thread_name)

        def report_running() -> None:
            if not self._stopping:  # a report that arrives after the stop is stale
                running()

        self._started = True
        try:
            if self._stopping:  # stopped before it began
                return
            reason = await self._serve_on_portal(to_trio, report_running)
        finally:
            self._ended.set()
        if reason is not None and not self._stopping:
            raise RuntimeFailed(
                f"node runtime on {self.settings.temporal} (namespace "
                f"{self.settings.namespace}, task queue {self.settings.task_queue}): {reason}"
            )

    async def stop(self) -> None:
        self._stopping = True
        if not self._started:
            return
        if self._stop_scope is not None:
            self._stop_scope.cancel()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(STOP_TIMEOUT):
                await self._ended.wait()

    async def _serve_on_portal(
        self, to_trio: TrioPortal, running: Callable[[], None]
    ) -> str | None:
        """Serve until stopped or cancelled (None), or until the worker ends by itself
        (why it did)."""
        reason: str | None = None
        stopped = False
        # The worker's call is shielded: a stop or a cancellation reaches it only through
        # `serving`, once the nursery is done.
        serving = trio.CancelScope(shield=True)
        try:
            async with (
                asyncio_portal(self.thread_name, stop_within=PORTAL_STOP) as portal,
                trio.open_nursery() as nursery,
            ):
                self._stop_scope = nursery.cancel_scope
                if self._stopping:  # stop() came while the portal started
                    nursery.cancel_scope.cancel()

                async def serve() -> None:
                    nonlocal reason
                    with serving:
                        try:
                            await portal.call(self._serve, to_trio, running)
                            reason = "its worker ended"
                        except Exception as e:  # whatever it is, run() reports it
                            reason = f"{type(e).__name__}: {e}"
                    nursery.cancel_scope.cancel()

                nursery.start_soon(serve)
                try:
                    await trio.sleep_forever()
                finally:
                    if reason is None:  # stopped, or cancelled, while its worker runs
                        stopped = True
                        await self._shut_down_worker(portal)
                    serving.cancel()
        except PortalStuck:
            pass  # logged, with where it is stuck; the daemon thread never holds up exit
        return None if stopped or serving.cancelled_caught else reason

    async def _shut_down_worker(self, portal: Portal) -> None:
        """Shut its worker down and wait for that to end, within WORKER_STOP; `serve`'s
        call then returns by itself. Not a cancellation: temporalio's worker frees its
        core only at the end of its shutdown, which a cancellation cuts short."""
        with trio.CancelScope(shield=True), trio.move_on_after(WORKER_STOP) as bounded:
            try:
                await portal.call(self._shut_down)
            except (PortalClosed, CallCancelled):
                pass  # the loop is ending: nothing is left to shut down
            except Exception:
                log.exception("node runtime %d: its worker's shutdown failed", self.number)
        if bounded.cancelled_caught:
            log.warning(
                "node runtime %d: its worker did not shut down within %g s; cancelled, it"
                " leaves behind what temporalio's core holds for it",
                self.number,
                WORKER_STOP,
            )

    # --- on the portal's asyncio loop -----------------------------------------------------

    async def _shut_down(self) -> None:
        worker = self._worker
        # Once its run() began (as soon as it is set), even while it still validates.
        if worker is not None and not worker.is_shutdown:
            await worker.shutdown()

    def _activities(self) -> list[Callable[..., Any]]:
        settings = self.settings
        activities: list[Callable[..., Any]] = [describe_activity(settings.node_id)]
        if settings.attempts is not None:
            activities.append(
                attempt_activity(
                    settings.node_id,
                    settings.identity.data_dir,
                    settings.attempts,
                    grant_check(settings),
                )
            )
        return activities

    async def _serve(self, to_trio: TrioPortal, running: Callable[[], None]) -> None:
        settings, identity = self.settings, self.settings.identity
        tls = tls_from_files(identity.ca_path, identity.cert_path, identity.key_path)
        client = await asyncio.wait_for(
            Client.connect(
                settings.temporal,
                namespace=settings.namespace,
                tls=tls,
                # Which process and which of its runtimes took a task, in the histories.
                identity=f"{settings.node_id}@{socket.gethostname()}:{os.getpid()}.{self.number}",
            ),
            CONNECT_TIMEOUT,
        )
        worker = Worker(
            client,
            task_queue=settings.task_queue,
            activities=self._activities(),
            max_concurrent_activities=settings.max_activities,
            graceful_shutdown_timeout=GRACEFUL_SHUTDOWN,
            max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
            build_id=BUILD_ID,
        )

        async def report_once_running() -> None:
            # temporalio has no event for "validated and polling", only this flag.
            while not worker.is_running:  # noqa: ASYNC110
                await asyncio.sleep(RUNNING_POLL)
            log.info(
                "node runtime working on %s, namespace %s, task queue %s",
                settings.temporal,
                settings.namespace,
                settings.task_queue,
            )
            to_trio.call_soon(running)  # nothing once the agent has ended

        self._worker = worker
        try:
            async with asyncio.TaskGroup() as group:
                reporter = group.create_task(report_once_running())
                await worker.run()
                # Ended without failing (the reporter may still wait on it): done.
                reporter.cancel()
        except ExceptionGroup as failed:
            # The worker's own error, not the group: what run() reports. Not `except*`: the
            # 3.11.2 of Debian 12 wraps an exception raised in one in a new, nameless
            # group, and the node's log said only "ExceptionGroup:  (1 sub-exception)".
            error = failed.exceptions[0]
            raise error from error.__cause__


class Runtimes:
    """The runtimes the agent has started, so a purge can stop what still runs; how its
    plugins are started (tests pass fakes); and the agent's attempt manager, which the
    runtimes hand attempts to and which outlives them."""

    def __init__(
        self,
        factory: RuntimeFactory = NodeRuntime,
        launch_plugin: plugins.Launch = plugins.launch_process,
        manager: AttemptManager | None = None,
    ) -> None:
        self.factory = factory
        self.launch_plugin = launch_plugin
        self.manager = manager
        self.live: set[Runtime] = set()
        # Attempts sent over the streams (jobs/intake.py), made with the first stream.
        self.intake: Intake | None = None

    async def end_attempts(self, why: str) -> None:
        """End every attempt this node runs (it was blocked, deleted or purged: WHY)."""
        if self.manager is not None:
            await self.manager.stop_all(why)

    async def run(self, settings: RuntimeSettings, running: Callable[[], None]) -> None:
        runtime = self.factory(settings)
        self.live.add(runtime)
        try:
            await runtime.run(running)
        finally:
            self.live.discard(runtime)

    async def stop_all(self) -> None:
        for runtime in list(self.live):
            await runtime.stop()
