"""The audit log's followers on this server (GET /api/v1/events, docs/audit-events.md):
each stream's lines, and the slots they hold.

A stream reads the log from its position (oz0/audit_stream.py: in the order transactions
became complete, none skipped, none twice) and then waits: for a commit that wrote rows
(the hub's `oz0_audit`), for its keep-alive's time, or, while rows wait behind an older
transaction still running (no notification comes when it ends), for a short while that
doubles up to HELD_MOST. A burst of commits shares one read (SETTLE). No database
connection is held while waiting: each read is a transaction of its own. Without the
hub's LISTEN connection it reads every UNHEARD_EVERY; without the database, every
RETRY_EVERY, its keep-alives going on meanwhile.

Lines: each event, its `cursor` in it; a keep-alive when nothing was sent for the
follower's interval, with the cursor to resume from (it moves past rows the follower's
kinds leave out); the first line is a keep-alive too, so a follower that asked from now
has a cursor before any event. A stream ends with an `end` line saying why (its
MAX_LIFE passed, the server stopping, its person's role or tenants changed, or, not
following, caught up): the follower connects again from the cursor.

Slots: at most MAX_STREAMS on a server and the server's `--max-event-streams-per-person`
per person; a stream takes its slot when its first line is asked for and frees it when it
ends however it ends (a client that left before never held one). A client that stops
reading is cut once a send waits past the server's send timeout (oz0/server/https.py),
and the whole answer is bounded by MAX_LIFE and a margin (its response timeout) anyway.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncGenerator
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from oz0 import access, audit_stream, cap_rules, operators, pki
from oz0.server_defaults import MAX_EVENT_STREAMS_PER_PERSON
from oz0.store.events import OPERATORS, EventHub, JobWatch, Subscription
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS
from oz0.store.pool import Database
from oz0_common.waits import first_of

MAX_STREAMS = 200
KEEPALIVE_DEFAULT = 15
KEEPALIVE_MIN, KEEPALIVE_MAX = 1, 300
# A stream ends after this (the follower connects again from its cursor): a person's
# rights are read again then at the latest, and a client that stopped reading lets go.
MAX_LIFE = 900.0
# Rows a read takes at most; a full one is followed by the next at once.
BATCH = 500
# Notifications in a burst (many commits at once) share one read.
SETTLE = 0.1
HELD_FIRST, HELD_MOST = 0.05, 2.0
UNHEARD_EVERY = 1.0
RETRY_EVERY = 1.0


@dataclass(eq=False)
class Follower:
    """One stream: its person as it opened, and whether to read that person again."""

    person: access.Person
    # The operator certificate it came with: its person is read again by it.
    identity: pki.Identity | None = None
    recheck: bool = False
    woken: JobWatch = field(default_factory=JobWatch)


@dataclass
class Followers:
    """The streams open on this server."""

    per_person: int = MAX_EVENT_STREAMS_PER_PERSON
    streams: set[Follower] = field(default_factory=set)

    def refusal(self, person: str) -> cap_rules.CapReached | None:
        """Why a new stream of PERSON may not open now (None: it may)."""
        if len(self.streams) >= MAX_STREAMS:
            return cap_rules.CapReached(
                f"{MAX_STREAMS} event streams are open on this server, its limit;"
                " follow through another server, or later",
                503,
            )
        if sum(1 for s in self.streams if s.person.name == person) >= self.per_person:
            return cap_rules.too_many_event_streams(person, self.per_person)
        return None

    async def held(
        self, follower: Follower, lines: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        """LINES, with FOLLOWER holding its slot from the first line asked for until they
        end, however they end."""
        if self.refusal(follower.person.name) is not None:
            return  # others took the last slot since the request was let in
        self.streams.add(follower)
        try:
            async for line in lines:
                yield line
        finally:
            self.streams.discard(follower)
            await lines.aclose()

    def subscribed(self, hub: EventHub) -> AbstractContextManager[Subscription]:
        """HUB's news of people heard (their streams read them again) while the block runs."""
        return hub.subscription(
            OPERATORS, notified=self._person_changed, on_gap=self._recheck_all
        )  # fmt: skip

    def _person_changed(self, notification: Notification) -> None:
        for follower in self.streams:
            if follower.person.name == notification.payload:
                follower.recheck = True
                follower.woken.wake()

    def _recheck_all(self) -> None:
        for follower in self.streams:
            follower.recheck = True
            follower.woken.wake()


@dataclass(frozen=True)
class Asked:
    """What a follower asked for (the query, checked)."""

    after: audit_stream.Position
    kinds: tuple[str, ...] = ()
    keepalive: float = KEEPALIVE_DEFAULT
    follow: bool = True


def _control(now: dt.datetime, position: audit_stream.Position, **what: Any) -> bytes:
    return audit_stream.json_line(
        {**what, "cursor": position.cursor(), "time": now.isoformat(timespec="seconds")}
    )


def keepalive_line(position: audit_stream.Position) -> bytes:
    return _control(_utcnow(), position, keepalive=True)


def end_line(position: audit_stream.Position, why: str) -> bytes:
    return _control(_utcnow(), position, end=why)


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


async def lines(
    db: Database,
    hub: EventHub | None,
    stopping: trio.Event,
    follower: Follower,
    asked: Asked,
) -> AsyncGenerator[bytes, None]:
    """The stream's lines (module docstring) until it ends."""
    scope = follower.person.scope
    position = asked.after
    yield keepalive_line(position)
    watching: AbstractContextManager[JobWatch | None] = (
        hub.watch_audit() if hub is not None else nullcontext(None)
    )
    with watching as watch:
        start = trio.current_time()
        ends, keepalive_at = start + MAX_LIFE, start + asked.keepalive
        held_wait = HELD_FIRST
        while True:
            read = partial(
                audit_stream.read, after=position, kinds=asked.kinds, scope=scope, limit=BATCH
            )
            try:
                batch: audit_stream.Batch | None = await db.transaction(read)
            except DATABASE_ERRORS:
                batch = None
            if batch is not None:
                for event in batch.events:
                    yield event.line()
                if batch.events:
                    keepalive_at = trio.current_time() + asked.keepalive
                position = batch.position
            why = await _why_end(db, follower, stopping, ends)
            if why is None and not asked.follow:
                if batch is None:
                    why = _DATABASE_AWAY
                elif batch.complete:
                    why = "caught up"
            if why is not None:
                yield end_line(position, why)
                return
            if batch is not None and not batch.complete:
                continue  # more at once
            now = trio.current_time()
            if now >= keepalive_at:
                yield keepalive_line(position)
                keepalive_at = now + asked.keepalive
            wake_at = min(keepalive_at, ends)
            if batch is None:
                wake_at = min(wake_at, now + RETRY_EVERY)
            elif batch.held:
                wake_at = min(wake_at, now + held_wait)
                held_wait = min(held_wait * 2, HELD_MOST)
            else:
                held_wait = HELD_FIRST
            if watch is None or hub is None or not hub.listening:
                wake_at = min(wake_at, now + UNHEARD_EVERY)
            waits = [follower.woken.wait, stopping.wait]
            if watch is not None:
                waits.append(watch.wait)
            with trio.move_on_at(wake_at):
                await first_of(*waits)
            await trio.sleep(SETTLE)


_DATABASE_AWAY = "the cluster's database is unavailable; resume from the cursor shortly"


async def _why_end(
    db: Database, follower: Follower, stopping: trio.Event, ends: float
) -> str | None:
    """Why the stream ends now (None: it goes on)."""
    if stopping.is_set():
        return "this server is stopping; resume from the cursor on another"
    if trio.current_time() >= ends:
        return f"a stream lasts {int(MAX_LIFE)} s at most; resume from the cursor"
    if follower.recheck and follower.identity is not None:
        identity = follower.identity
        try:
            current = await db.transaction(lambda conn: operators.person_of(conn, identity))
        except DATABASE_ERRORS:
            return None  # asked again at the next turn (recheck stays set)
        follower.recheck = False
        was = follower.person
        if current is None or (current.role, current.tenants) != (was.role, was.tenants):
            return "your certificate, role or tenants changed; connect again"
    return None
