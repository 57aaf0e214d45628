"""GET /ui/events: server-sent events that keep a page's nodes current without a reload.

A page names the nodes it shows (`?nodes=ID,ID`, at most MAX_WATCHED) and, for a list,
asks to hear of others (`&new=1`). One feed per server subscribes to the LISTEN hub (a
node's state, tenant or key changed; its server changed) and wakes the streams watching
that node; every stream also re-reads its nodes every REREAD_EVERY, since a node going
silent changes no row and a LISTEN gap loses notifications. Each stream sends a node only
when what the page shows of it changed, and ends after MAX_LIFE (the browser reconnects)
or at once when its session has ended, or within REREAD_EVERY once the server begins to
stop (its drain waits for every request in flight).
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio
from quart import Blueprint, Response, request

from oz0 import listing, nodes
from oz0 import ui_sessions as sessions
from oz0.store.events import NODE_LINKS, NODES, EventHub
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS
from oz0.web.pages import Page, Pages

log = logging.getLogger(__name__)

MAX_WATCHED = 200
MAX_STREAMS = 200
REREAD_EVERY = 1.0
# Notifications in a burst (a block fan-out, a reconnect storm) share one read.
SETTLE = 0.1
KEEPALIVE_EVERY = 15.0
SESSION_CHECK_EVERY = 5.0
MAX_LIFE = 600.0
RECONNECT_MS = 2000


@dataclass(eq=False)
class Stream:
    watched: frozenset[str]
    want_others: bool
    woken: trio.Event = field(default_factory=trio.Event)
    others_changed: bool = False


@dataclass
class Feed:
    """The streams open on this server, woken by the hub's notifications about nodes."""

    streams: set[Stream] = field(default_factory=set)

    def attach(self, hub: EventHub) -> None:
        hub.subscribe(NODES, self._changed)
        hub.subscribe(NODE_LINKS, self._changed)
        hub.on_gap.append(self._wake_all)

    def _changed(self, notification: Notification) -> None:
        for stream in self.streams:
            if notification.payload in stream.watched:
                stream.woken.set()
            elif stream.want_others:
                stream.others_changed = True
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
    feed = Feed()
    if state.hub is not None:
        feed.attach(state.hub)

    def read(
        conn: psycopg.Connection[Any], ids: list[str], scope: listing.Scope
    ) -> dict[str, dict[str, Any]]:
        # Another tenant's node than the person's is sent as gone, as an unknown ID is.
        return {n.id: _shown(n) for n in nodes.get_many(conn, ids, scope=scope)}

    async def body(stream: Stream, token: str | None, scope: listing.Scope) -> AsyncIterator[bytes]:
        ids = sorted(stream.watched)
        last: dict[str, dict[str, Any] | None] = {}
        now = trio.current_time()
        ends, keepalive, check = now + MAX_LIFE, now + KEEPALIVE_EVERY, now + SESSION_CHECK_EVERY
        try:
            yield f"retry: {RECONNECT_MS}\n\n".encode()
            while trio.current_time() < ends and not state.stopping.is_set():
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
                now = trio.current_time()
                if now >= keepalive:
                    keepalive = now + KEEPALIVE_EVERY
                    yield b": still here\n\n"
                if now >= check:
                    check = now + SESSION_CHECK_EVERY
                    if await pages.session_of(token) is None:
                        yield _event("signed-out", {})
                        return
                with trio.move_on_after(REREAD_EVERY):
                    await stream.woken.wait()
                stream.woken = trio.Event()
                await trio.sleep(SETTLE)
        finally:
            feed.streams.discard(stream)

    @web.get("/ui/events")
    async def events() -> Page:
        scope = (await pages.session()).person.scope
        if len(feed.streams) >= MAX_STREAMS:
            return "too many live pages are open on this server; reload later", 503
        stream = Stream(_watched(request.args.get("nodes", "")), request.args.get("new") == "1")
        feed.streams.add(stream)
        response = Response(
            body(stream, request.cookies.get(sessions.COOKIE), scope),
            mimetype="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )
        response.timeout = MAX_LIFE + 30
        return response
