"""The events role: one LISTEN connection per server, fanned out to whoever waits.

A lost connection is logged (once per outage) and reopened with backoff; once it listens
again, subscribers are told to reconcile, since notifications sent meanwhile are gone.
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
CHANNELS = (NODES, OPERATORS, NODE_LINKS)
RELISTEN_AFTER = 1.0

Subscriber = Callable[[Notification], None]
_LISTEN_ERRORS: tuple[type[Exception], ...] = (ListenConnectionLost, *DATABASE_ERRORS)


@dataclass
class EventHub:
    conninfo: str
    _subscribers: dict[str, list[Subscriber]] = field(default_factory=lambda: defaultdict(list))
    _node_waiters: dict[str, list[trio.Event]] = field(default_factory=lambda: defaultdict(list))
    _deaf_to_gaps: set[trio.Event] = field(default_factory=set)
    on_gap: list[Callable[[], None]] = field(default_factory=list)

    def subscribe(self, channel: str, subscriber: Subscriber) -> None:
        self._subscribers[channel].append(subscriber)

    @contextmanager
    def watch_node(self, node_id: str, *, wake_on_gap: bool = True) -> Iterator[trio.Event]:
        """An event set at the next notification about NODE_ID, or a wake for it, or (with
        WAKE_ON_GAP) once listening again after a LISTEN gap.

        Watch before reading the node, so a change between the read and the wait is seen.
        Watchers covered by a reconcile of their own (control streams) pass
        WAKE_ON_GAP=False, so a gap does not make thousands of them read at once.
        """
        event = trio.Event()
        self._node_waiters[node_id].append(event)
        if not wake_on_gap:
            self._deaf_to_gaps.add(event)
        try:
            yield event
        finally:
            self._deaf_to_gaps.discard(event)
            waiters = self._node_waiters.get(node_id)
            if waiters is not None and event in waiters:
                waiters.remove(event)
                if not waiters:
                    del self._node_waiters[node_id]

    def wake(self, node_id: str) -> None:
        """Wake whoever watches NODE_ID, as a notification about it would."""
        for event in self._node_waiters.pop(node_id, ()):
            event.set()

    def _dispatch(self, notification: Notification) -> None:
        for subscriber in self._subscribers.get(notification.channel, ()):
            subscriber(notification)
        if notification.channel == NODES:
            self.wake(notification.payload)

    def _gap(self) -> None:
        for callback in self.on_gap:
            callback()
        for node_id, waiters in list(self._node_waiters.items()):
            deaf = [event for event in waiters if event in self._deaf_to_gaps]
            for event in waiters:
                if event not in self._deaf_to_gaps:
                    event.set()
            if deaf:
                self._node_waiters[node_id] = deaf
            else:
                del self._node_waiters[node_id]

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
                    if first:
                        first = False
                        task_status.started()
                    elif outage.ongoing:
                        outage.worked()
                        self._gap()
            except* _LISTEN_ERRORS as group:
                if first:
                    raise
                delay = outage.failed(group.exceptions[0])
            else:
                delay = RELISTEN_AFTER
            await trio.sleep(delay)
