"""The events role: one LISTEN connection per server, fanned out to whoever waits.

A lost connection is logged and reopened; subscribers are told to reconcile then, since
notifications sent meanwhile are gone.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import trio

from oz0.store.listen import ListenConnectionLost, Notification, listen

log = logging.getLogger(__name__)

NODES = "oz0_nodes"
OPERATORS = "oz0_operators"
CHANNELS = (NODES, OPERATORS)
RELISTEN_AFTER = 1.0

Subscriber = Callable[[Notification], None]


@dataclass
class EventHub:
    conninfo: str
    _subscribers: dict[str, list[Subscriber]] = field(default_factory=lambda: defaultdict(list))
    _node_waiters: dict[str, list[trio.Event]] = field(default_factory=lambda: defaultdict(list))
    on_gap: list[Callable[[], None]] = field(default_factory=list)

    def subscribe(self, channel: str, subscriber: Subscriber) -> None:
        self._subscribers[channel].append(subscriber)

    @contextmanager
    def watch_node(self, node_id: str) -> Iterator[trio.Event]:
        """An event set at the next notification about NODE_ID (or a LISTEN gap).

        Watch before reading the node, so a change between the read and the wait is seen.
        """
        event = trio.Event()
        self._node_waiters[node_id].append(event)
        try:
            yield event
        finally:
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
        for waiters in self._node_waiters.values():
            for event in waiters:
                event.set()
        self._node_waiters.clear()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen until cancelled; started once every LISTEN is registered."""
        await listen(self.conninfo, CHANNELS, self._dispatch, task_status=task_status)

    async def run_forever(
        self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Listen, and listen again after a lost connection; the first failure is fatal."""
        first = True
        while True:
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(self.run)
                    if first:
                        first = False
                        task_status.started()
            except* (ListenConnectionLost, psycopg.OperationalError) as group:
                if first:
                    raise
                log.warning("%s; listening again in %.0fs", group.exceptions[0], RELISTEN_AFTER)
            self._gap()
            await trio.sleep(RELISTEN_AFTER)
