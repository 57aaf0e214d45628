"""The events role: one LISTEN connection per server, fanned out to whoever waits.

A lost connection is logged (once per outage) and reopened with backoff; once it listens
again, subscribers are told to reconcile, since notifications sent meanwhile are gone.

Whoever hears it holds a subscription (`EventHub.subscription`) or a watch for as long as a
block of its own runs: a task that ends, however it ends, is heard from no more.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import trio

from oz0.store.listen import ListenConnectionLost, Notification, listen
from oz0.store.outage import DATABASE_ERRORS, Outage

log = logging.getLogger(__name__)

NODES = "oz0_nodes"
OPERATORS = "oz0_operators"
# A node's server changed (connected, moved, disconnected): only the web UI listens.
NODE_LINKS = "oz0_node_links"
# A job's record changed (output added, an attempt placed or ended, the job queued or
# ended); the payload is its ID. Followers of the job's output wait on it (watch_job).
JOBS = "oz0_jobs"
# A streamed attempt was placed on a node (oz0/jobs/parts.py); the payload is the node's
# ID. The edge holding the node's stream sends what waits for it (watch_attempts).
ATTEMPTS = "oz0_attempts"
# A transaction that wrote audit rows committed (migration 0032); no payload. Followers of
# the log wait on it (watch_audit).
AUDIT = "oz0_audit"
CHANNELS = (NODES, OPERATORS, NODE_LINKS, JOBS, ATTEMPTS, AUDIT)
RELISTEN_AFTER = 1.0

Subscriber = Callable[[Notification], None]
_LISTEN_ERRORS: tuple[type[Exception], ...] = (ListenConnectionLost, *DATABASE_ERRORS)
DELETED = "deleted"


@dataclass(frozen=True)
class NodeNews:
    """A node's row as a notification on `oz0_nodes` tells it (migration 0013): its state
    (`deleted` once gone), its key's SHA-256 (None before it has one) and revision."""

    node_id: str
    state: str
    key_sha256: str | None
    revision: int

    @classmethod
    def parse(cls, payload: str) -> tuple[str, NodeNews | None]:
        """The node ID of PAYLOAD and its news; None for a payload of the ID alone."""
        parts = payload.split(" ")
        if len(parts) != 4 or not parts[3].isdigit():
            return payload, None
        node_id, state, key, revision = parts
        return node_id, cls(node_id, state, None if key == "-" else key, int(revision))

    def newer_than(self, revision: int) -> bool:
        """Whether this is news to whoever read the node at REVISION: revisions of one node
        rise in the order of its commits, and a deletion keeps the revision it ended."""
        return self.revision > revision or (self.state == DELETED and self.revision == revision)

    def state_for(self, key_sha256: str) -> str | None:
        """The state as a stream opened with KEY_SHA256 sees it: None once the node is
        gone, or holds another key (its ID now someone else's)."""
        if self.state == DELETED or self.key_sha256 != key_sha256:
            return None
        return self.state


class NodeWatch:
    """Woken at each notification about one node (with its news, when the notification
    carried it), a wake for it, or (unless deaf to them) a LISTEN gap; until unwatched."""

    def __init__(self, *, wake_on_gap: bool) -> None:
        self.wake_on_gap = wake_on_gap
        self._woken = trio.Event()
        self._news: NodeNews | None = None

    def wake(self, news: NodeNews | None) -> None:
        # A wake without news since the last wait leaves the watcher nothing to trust but
        # a read of its own.
        first = not self._woken.is_set()
        self._news = news if first or self._news is not None else None
        self._woken.set()

    def is_set(self) -> bool:
        """Whether woken since the last wait."""
        return self._woken.is_set()

    async def wait(self) -> NodeNews | None:
        """Until woken since the last wait; the latest news, or None when some wake since
        carried none (a read tells what changed)."""
        await self._woken.wait()
        self._woken = trio.Event()
        news, self._news = self._news, None
        return news


@dataclass(frozen=True, eq=False)
class Subscription:
    """Who hears CHANNELS (NOTIFIED, with each notification) and gaps in them (ON_GAP),
    while its block runs (`EventHub.subscription`)."""

    channels: frozenset[str]
    notified: Subscriber | None
    on_gap: Callable[[], None] | None


class JobWatch:
    """Woken at each notification about one job, a LISTEN gap, or a lost LISTEN
    connection: whoever waits then reads the job; until unwatched."""

    def __init__(self) -> None:
        self._woken = trio.Event()

    def wake(self) -> None:
        self._woken.set()

    async def wait(self) -> None:
        """Until woken since the last wait."""
        await self._woken.wait()
        self._woken = trio.Event()


@dataclass
class EventHub:
    conninfo: str
    _subscriptions: list[Subscription] = field(default_factory=list)
    _node_watches: dict[str, list[NodeWatch]] = field(default_factory=lambda: defaultdict(list))
    _job_watches: dict[str, list[JobWatch]] = field(default_factory=lambda: defaultdict(list))
    _attempt_watches: dict[str, list[JobWatch]] = field(default_factory=lambda: defaultdict(list))
    _audit_watches: list[JobWatch] = field(default_factory=list)
    # Whether notifications reach us now: while not, a watch of a job would wait in vain,
    # so a reader that would wait reads again on its own clock instead.
    listening: bool = False

    @contextmanager
    def subscription(
        self,
        *channels: str,
        notified: Subscriber | None = None,
        on_gap: Callable[[], None] | None = None,
    ) -> Iterator[Subscription]:
        """NOTIFIED called (in the Trio thread) with each notification on CHANNELS, and
        ON_GAP after each gap in them (notifications were lost: reconcile), until the block
        ends, however it ends. Subscribe before reading, so a change between the read and
        the notification is heard."""
        if channels and notified is None:
            raise ValueError("a subscription to channels needs a subscriber to notify")
        subscription = Subscription(frozenset(channels), notified, on_gap)
        self._subscriptions.append(subscription)
        try:
            yield subscription
        finally:
            self._subscriptions.remove(subscription)

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        """Those held now, oldest first."""
        return tuple(self._subscriptions)

    @contextmanager
    def watch_node(self, node_id: str, *, wake_on_gap: bool = True) -> Iterator[NodeWatch]:
        """A watch of NODE_ID, woken at every notification about it until the block ends.

        Watch before reading the node, so a change between the read and the wait is seen.
        Watchers covered by a reconcile of their own (control streams) pass
        WAKE_ON_GAP=False, so a gap does not make thousands of them read at once.
        """
        watch = NodeWatch(wake_on_gap=wake_on_gap)
        self._node_watches[node_id].append(watch)
        try:
            yield watch
        finally:
            watches = self._node_watches.get(node_id)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._node_watches[node_id]

    @contextmanager
    def watch_job(self, job_id: str) -> Iterator[JobWatch]:
        """A watch of JOB_ID, woken at every notification about it until the block ends.
        Watch before reading the job, so a change between the read and the wait is seen."""
        watch = JobWatch()
        self._job_watches[job_id].append(watch)
        try:
            yield watch
        finally:
            watches = self._job_watches.get(job_id)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._job_watches[job_id]

    @contextmanager
    def watch_attempts(self, node_id: str) -> Iterator[JobWatch]:
        """A watch of the streamed attempts placed on NODE_ID, woken at each placement and
        after a gap in the notifications. Watch before reading them."""
        watch = JobWatch()
        self._attempt_watches[node_id].append(watch)
        try:
            yield watch
        finally:
            watches = self._attempt_watches.get(node_id)
            if watches is not None:
                watches.remove(watch)
                if not watches:
                    del self._attempt_watches[node_id]

    @contextmanager
    def watch_audit(self) -> Iterator[JobWatch]:
        """A watch of the audit log, woken at each commit that wrote rows, after a gap in
        the notifications and when the LISTEN connection is lost. Watch before reading."""
        watch = JobWatch()
        self._audit_watches.append(watch)
        try:
            yield watch
        finally:
            self._audit_watches.remove(watch)

    def _wake_audit(self) -> None:
        for watch in self._audit_watches:
            watch.wake()

    def _wake_jobs(self) -> None:
        for watches in self._job_watches.values():
            for watch in watches:
                watch.wake()

    def wake(self, node_id: str, news: NodeNews | None = None) -> None:
        """Wake whoever watches NODE_ID, as a notification about it would."""
        for watch in self._node_watches.get(node_id, ()):
            watch.wake(news)

    def _dispatch(self, notification: Notification) -> None:
        news = None
        if notification.channel == NODES:
            # Subscribers hear of the node by its ID; its watchers also get the news.
            node_id, news = NodeNews.parse(notification.payload)
            notification = Notification(NODES, node_id)
        for subscription in self.subscriptions:
            if subscription.notified is not None and notification.channel in subscription.channels:
                subscription.notified(notification)
        if notification.channel == NODES:
            self.wake(notification.payload, news)
        elif notification.channel == JOBS:
            for watch in self._job_watches.get(notification.payload, ()):
                watch.wake()
        elif notification.channel == ATTEMPTS:
            for watch in self._attempt_watches.get(notification.payload, ()):
                watch.wake()
        elif notification.channel == AUDIT:
            self._wake_audit()

    def _gap(self) -> None:
        for subscription in self.subscriptions:
            if subscription.on_gap is not None:
                subscription.on_gap()
        for watches in self._node_watches.values():
            for watch in watches:
                if watch.wake_on_gap:
                    watch.wake(None)
        self._wake_jobs()
        for attempt_watches in self._attempt_watches.values():
            for attempt_watch in attempt_watches:
                attempt_watch.wake()
        self._wake_audit()

    def _lost(self) -> None:
        """The LISTEN connection is gone: the jobs' and the audit log's watchers read now
        and, until it is back, no longer wait for news (`listening`)."""
        self.listening = False
        self._wake_jobs()
        self._wake_audit()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; started once every LISTEN is registered."""
        await listen(self.conninfo, CHANNELS, self._dispatch, task_status=task_status)

    async def run_forever(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen, and listen again after a lost connection; only a failure at start is
        fatal. The gap is announced once listening again, when whoever reconciles can
        read the database."""
        first = True
        outage = Outage("LISTEN for notifications", log, first_retry=RELISTEN_AFTER)
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.run)
                    self.listening = True
                    if first:
                        first = False
                        task_status.started()
                    elif outage.ongoing:
                        outage.worked()
                        self._gap()
            except* _LISTEN_ERRORS as group:
                self._lost()
                if first:
                    raise
                delay = outage.failed(group.exceptions[0])
            else:
                delay = RELISTEN_AFTER
            await trio.sleep(delay)
