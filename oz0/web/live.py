"""GET /ui/events: server-sent events that keep a page's nodes current without a reload.

A page names the nodes it shows (`?nodes=ID,ID`, at most MAX_WATCHED) and, for a list,
asks to hear of others (`&new=1`). One feed per server subscribes to the LISTEN hub (a
node's state, tenant or key changed; its server changed) and wakes the streams watching
that node; every stream also re-reads its nodes every REREAD_EVERY, since a node going
silent changes no row and a LISTEN gap loses notifications. Each stream sends a node only
when what the page shows of it changed (another tenant's than its person's as gone, as an
unknown one), tells a list of others only when they may concern its person (any node for
a cluster-wide one, its tenants' for another: live_others), and ends after MAX_LIFE (the
browser reconnects), within about two seconds of its session's end (signed out, expired,
its person removed: every SESSION_CHECK_EVERY one query asks about the sessions of all
of this server's streams), or within REREAD_EVERY once the server begins to stop (its
drain waits for every request in flight).

A stream takes its slot (of MAX_STREAMS on the server, MAX_STREAMS_PER_SESSION per
session, and the server's `--max-live-pages-per-person` per person, whatever the session:
one viewer with many sessions cannot take them all) when its first event is asked for,
and frees it when it ends however it ends: a client that left before that never held
one. Following a stream is no activity: it does not keep its session from going idle.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio
from quart import Blueprint, Response, request

from oz0 import access, cap_rules, listing, nodes
from oz0 import ui_sessions as sessions
from oz0.server_defaults import MAX_LIVE_PAGES_PER_PERSON
from oz0.store.events import NODE_LINKS, NODES, EventHub, Subscription
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS
from oz0.store.pool import Database
from oz0.web.live_others import Changed
from oz0.web.pages import Page, Pages

log = logging.getLogger(__name__)

MAX_WATCHED = 200
MAX_STREAMS = 200
# A person's tabs each hold one; more than this from one session is a loop or an attack.
MAX_STREAMS_PER_SESSION = 10
REREAD_EVERY = 1.0
# Notifications in a burst (a block fan-out, a reconnect storm) share one read.
SETTLE = 0.1
KEEPALIVE_EVERY = 15.0
SESSION_CHECK_EVERY = 1.0
MAX_LIFE = 600.0
RECONNECT_MS = 2000


@dataclass(eq=False)
class Stream:
    watched: frozenset[str]
    want_others: bool
    # The session's cookie: the stream lives as long as the session does.
    token: str
    # Its person's role and tenants when it opened: the page was made for them.
    rights: tuple[access.Role, frozenset[str]]
    woken: trio.Event = field(default_factory=trio.Event)
    others_changed: bool = False
    # Its session has ended (found by Feed.check_sessions).
    ended: bool = False
    # Its person was given another role or other tenants: the page shows what it may no
    # longer see, or lacks what it now may (found by Feed.check_sessions).
    changed: bool = False
    # Its person's name: a person's streams are capped, across their sessions.
    person: str = ""

    @property
    def scope(self) -> frozenset[str] | None:
        """The tenants whose nodes the page may hear of; None: every tenant's."""
        return self.rights[1] or None


@dataclass
class Feed:
    """The streams open on this server, woken by the hub's notifications about nodes."""

    streams: set[Stream] = field(default_factory=set)
    # Streams one person may hold on this server (`server start --max-live-pages-per-person`).
    per_person: int = MAX_LIVE_PAGES_PER_PERSON
    # When the streams' sessions are next asked about, on the Trio clock.
    next_check: float = float("-inf")
    checking: trio.Lock = field(default_factory=trio.Lock)
    # The nodes that changed, for the lists of a person of some tenants (live_others).
    changed: Changed = field(default_factory=Changed)

    def full_for(self, token: str, person: str = "") -> str | None:
        """Why a new stream of the session TOKEN names, of PERSON, may not open now (None:
        it may)."""
        if len(self.streams) >= MAX_STREAMS:
            return "too many live pages are open on this server; reload later"
        if sum(1 for s in self.streams if s.token == token) >= MAX_STREAMS_PER_SESSION:
            return "too many live pages are open in this session; close some and reload"
        if self.person_full(person):
            return str(cap_rules.too_many_live_pages(person, self.per_person))
        return None

    def person_full(self, person: str) -> bool:
        """Whether PERSON holds as many streams on this server as a person may."""
        return bool(person) and sum(1 for s in self.streams if s.person == person) >= (
            self.per_person
        )

    async def held(
        self, stream: Stream, events: AsyncGenerator[bytes, None]
    ) -> AsyncGenerator[bytes, None]:
        """EVENTS, with STREAM holding its slot from the first event asked for until they
        end, however they end. Registered here, in the generator, not before the response
        is sent: a client that leaves before the body starts never runs this, and so
        never takes a slot it would not give back."""
        if self.full_for(stream.token, stream.person) is not None:
            return  # others took the last slot since the request was let in
        self.streams.add(stream)
        try:
            async for event in events:
                yield event
        finally:
            self.streams.discard(stream)
            await events.aclose()

    async def check_sessions(self, db: Database) -> None:
        """Ask once, for every stream, whether its session goes on and its person still has
        the role and tenants its page was made for; wake those for which either is not so.
        Whichever stream finds the check due does it for all."""
        if self.checking.locked() or trio.current_time() < self.next_check:
            return
        async with self.checking:
            self.next_check = trio.current_time() + SESSION_CHECK_EVERY
            asked = list(self.streams)
            tokens = {s.token for s in asked}
            try:
                going_on = await db.transaction(lambda conn: sessions.open_among(conn, tokens))
            except DATABASE_ERRORS:
                return  # asked again at the next check; the database's outage ends nothing
            for stream in asked:
                rights = going_on.get(stream.token)
                if rights is None:
                    stream.ended = True
                    stream.woken.set()
                elif rights != stream.rights:
                    stream.changed = True
                    stream.woken.set()

    def subscribed(self, hub: EventHub) -> AbstractContextManager[Subscription]:
        """HUB's news of nodes heard (the streams watching them woken) while the block runs."""
        return hub.subscription(NODES, NODE_LINKS, notified=self._changed, on_gap=self._wake_all)

    def _changed(self, notification: Notification) -> None:
        node_id, noted = notification.payload, False
        for stream in self.streams:
            if node_id in stream.watched:
                stream.woken.set()
            elif stream.want_others:
                scope = stream.scope
                if scope is None:
                    stream.others_changed = True
                    stream.woken.set()
                elif not self.changed.outside(node_id, scope):
                    # Perhaps one of its tenants': the stream reads which (live_others).
                    if not noted:
                        self.changed.note(node_id)
                        noted = True
                    stream.woken.set()

    def _wake_all(self) -> None:
        for stream in self.streams:
            stream.woken.set()


def _shown(node: nodes.Node) -> dict[str, Any]:
    """What a page shows of a node live: a change of any of it is sent."""
    return {
        "id": node.id,
        "state": node.state,
        "connected": node.connected,
        "server": node.server if node.connected else None,
        "reason": node.reason,
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def _watched(text: str) -> frozenset[str]:
    ids = [part for part in text.split(",") if nodes.is_node_id(part)]
    return frozenset(ids[:MAX_WATCHED])


def add(web: Blueprint, pages: Pages) -> None:
    state = pages.state
    feed = state.live_pages

    def read(
        conn: psycopg.Connection[Any], ids: list[str], scope: listing.Scope
    ) -> dict[str, dict[str, Any]]:
        # Another tenant's node than the person's is sent as gone, as an unknown ID is.
        return {n.id: _shown(n) for n in nodes.get_many(conn, ids, scope=scope)}

    async def others(stream: Stream, seen: int) -> tuple[bool, int]:
        """Whether a scoped list is to hear of nodes noted since number SEEN (one of its
        tenants' among them), and the number to read on from; the same SEEN again when the
        database cannot be asked now."""
        noted, upto = feed.changed.since(seen)
        noted -= stream.watched
        if not noted or stream.scope is None:
            return False, upto
        try:
            return await feed.changed.any_within(state.db, noted, stream.scope), upto
        except DATABASE_ERRORS:
            return False, seen

    async def body(stream: Stream, scope: listing.Scope) -> AsyncGenerator[bytes, None]:
        ids = sorted(stream.watched)
        last: dict[str, dict[str, Any] | None] = {}
        # Where a scoped list is in the nodes noted for such lists (Feed.changed).
        seen = feed.changed.count
        now = trio.current_time()
        ends, keepalive = now + MAX_LIFE, now + KEEPALIVE_EVERY
        yield f"retry: {RECONNECT_MS}\n\n".encode()
        while trio.current_time() < ends and not state.stopping.is_set():
            await feed.check_sessions(state.db)
            if stream.ended:
                yield _event("signed-out", {})
                return
            if stream.changed:
                # The page reloads, made for the person's new role and tenants.
                yield _event("reload", {})
                return
            try:
                current = await state.db.transaction(lambda conn: read(conn, ids, scope))
            except DATABASE_ERRORS:
                current = None  # shown as it was; read again at the next turn
            for node_id in ids if current is not None else ():
                shown = current.get(node_id) if current is not None else None
                # The first read is sent whole: the page may be older than the stream.
                if node_id not in last or last[node_id] != shown:
                    yield _event("node", shown or {"id": node_id, "gone": True})
                last[node_id] = shown
            if stream.others_changed:
                stream.others_changed = False
                yield _event("others", {})
            elif stream.want_others and scope is not None:
                told, seen = await others(stream, seen)
                if told:
                    yield _event("others", {})
            now = trio.current_time()
            if now >= keepalive:
                keepalive = now + KEEPALIVE_EVERY
                yield b": still here\n\n"
            with trio.move_on_after(REREAD_EVERY):
                await stream.woken.wait()
            stream.woken = trio.Event()
            if not (stream.ended or stream.changed):
                await trio.sleep(SETTLE)

    @web.get("/ui/events")
    async def events() -> Page:
        # Not touched: following a page is no activity.
        person = (await pages.session()).person
        token = request.cookies.get(sessions.COOKIE, "")
        full = feed.full_for(token, person.name)
        if full is not None:
            if feed.person_full(person.name):
                state.metrics.person_cap_hit("live_pages")
            return full, 503 if len(feed.streams) >= MAX_STREAMS else 429
        stream = Stream(
            _watched(request.args.get("nodes", "")),
            request.args.get("new") == "1",
            token,
            (person.role, person.tenants),
            person=person.name,
        )
        response = Response(
            feed.held(stream, body(stream, person.scope)),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        response.timeout = MAX_LIFE + 30
        return response
