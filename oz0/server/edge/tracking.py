"""What the edge keeps about its streams: who was seen, and whether they may stay."""

from __future__ import annotations

import collections
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import trio

from oz0 import nodes
from oz0.server_defaults import RECONCILE_EVERY as RECONCILE_EVERY
from oz0.store.events import EventHub
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database

log = logging.getLogger(__name__)

LEFT_SETTLE = 0.25


@dataclass
class SeenTracker:
    """Batches what streams tell about their nodes into one transaction per heartbeat
    interval: who was heard from (alive here) and whose stream ended (gone from here).

    A node whose stream ended may connect again here at once (a renewed certificate, a
    move): its new stream records it connected (`nodes.control_connect`) inside
    `connecting`, and a write of it as gone must not land after that record. So a flush
    leaves out the nodes connecting meanwhile (their new stream says alive, or, refused,
    they stay gone for the next flush), and a node that begins connecting while a flush's
    write is under way waits for that write first.
    """

    db: Database
    server_id: str
    pending: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    outage: Outage = field(default_factory=lambda: Outage("recording streamed nodes seen", log))

    # Nodes whose new stream is recording them connected here, how many streams each.
    connecting_now: collections.Counter[str] = field(default_factory=collections.Counter)
    _someone_left: trio.Event = field(default_factory=trio.Event)
    # Set when the flush under way has written (None: none is under way).
    _written: trio.Event | None = None

    def alive(self, node_id: str) -> None:
        self.pending.add(node_id)
        self.gone.discard(node_id)

    @contextlib.asynccontextmanager
    async def connecting(self, node_id: str) -> AsyncIterator[None]:
        """Around a new stream's record of NODE_ID as connected here, and its `alive` when
        accepted: no write of the node as gone lands after that record (class docstring)."""
        self.connecting_now[node_id] += 1
        try:
            if self._written is not None:
                await self._written.wait()
            yield
        finally:
            self.connecting_now[node_id] -= 1
            if self.connecting_now[node_id] <= 0:
                del self.connecting_now[node_id]

    def left(self, node_id: str) -> None:
        # A heartbeat heard just before the stream ended must not mark it connected again.
        self.pending.discard(node_id)
        self.gone.add(node_id)
        self._someone_left.set()

    async def flush(self) -> None:
        held = {n for n in self.gone if n in self.connecting_now}
        if held:
            # Refused, they are still gone: written soon, as any stream's end.
            self._someone_left.set()
        if not self.pending and not self.gone - held:
            return
        seen, self.pending = sorted(self.pending), set()
        gone, self.gone = sorted(self.gone - held), held
        written = self._written = trio.Event()
        try:
            await self.db.transaction(
                lambda conn: nodes.streams_recorded(conn, seen, gone, self.server_id)
            )
        except DATABASE_ERRORS as e:
            # Kept for the next flush: a node whose stream ended during an outage must not
            # stay shown connected here once the database is back.
            self.outage.failed(e)
            self.pending |= set(seen) - self.gone
            self.gone |= set(gone) - self.pending
            return
        finally:
            self._written = None
            written.set()
        self.outage.worked()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                # A stream that ended is written soon (the web UI shows it within 2 s);
                # heartbeats wait for the interval. Ends in a burst share one write.
                with trio.move_on_after(nodes.HEARTBEAT):
                    await self._someone_left.wait()
                    await trio.sleep(LEFT_SETTLE)
                self._someone_left = trio.Event()
                await self.flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.flush()


@dataclass
class StreamReconciler:
    """Asks every second (by default) whether the nodes with a stream here are all still accepted.

    Notifications end streams within milliseconds; this is the backstop that keeps a
    block inside its two seconds when one is lost.
    """

    db: Database
    hub: EventHub
    every: float = RECONCILE_EVERY
    open: collections.Counter[str] = field(default_factory=collections.Counter)
    outage: Outage = field(
        default_factory=lambda: Outage("reconciling the states of streamed nodes", log)
    )
    _now: trio.Event = field(default_factory=trio.Event)
    _closed: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)

    def check_soon(self) -> None:
        self._now.set()

    def __len__(self) -> int:
        return self.open.total()

    def opened(self, node_id: str) -> None:
        self.open[node_id] += 1

    def count(self, node_id: str) -> int:
        """How many of the node's streams are open here (two while a reconnected node's old
        stream is still closing)."""
        return self.open.get(node_id, 0)

    def closed(self, node_id: str) -> None:
        self.open[node_id] -= 1
        if self.open[node_id] <= 0:
            del self.open[node_id]
        self._closed.unpark_all()

    async def wait_all_closed(self) -> None:
        """Return once no stream is open here (a draining edge waits on it)."""
        while self.open:
            await self._closed.park()

    async def check(self) -> None:
        watched = list(self.open)
        if not watched:
            return
        stale = await self.db.transaction(lambda conn: nodes.not_accepted(conn, watched))
        for node_id in stale:
            self.hub.wake(node_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Notifications were lost while the LISTEN connection was down: check at once.
        with self.hub.subscription(on_gap=self.check_soon):
            task_status.started()
            wait = self.every
            while True:
                with trio.move_on_after(wait):
                    await self._now.wait()
                self._now = trio.Event()
                try:
                    await self.check()
                except DATABASE_ERRORS as e:
                    wait = max(self.every, self.outage.failed(e))
                    continue
                self.outage.worked()
                wait = self.every
