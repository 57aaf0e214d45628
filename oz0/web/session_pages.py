"""/sessions: sessions on nodes, the live ones first; /sessions/ID: one, and for the
admins of its tenant its recording, shown as the text it left on the terminal and played
back by session-replay.js (the asciicast's output events, escape sequences left out: a
terminal library is not vendored, and plain text is what a reviewer reads)."""

from __future__ import annotations

import json
import re
from typing import Any

from quart import Blueprint, request

from oz0 import access, node_sessions
from oz0.web.pages import Page, Pages, text_arg

PAGE = 100
# What a terminal draws with rather than shows: CSI and OSC sequences, other escapes.
_ESCAPES = re.compile(
    r"\x1b\[[0-?]*[ -/]*[@-~]"  # CSI: colours, cursor moves, erasing
    r"|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"  # OSC: the window's title
    r"|\x1b[@-Z\\-_]"  # other escapes
    r"|[\x00-\x08\x0b-\x1f\x7f]"  # controls but tab and newline
)


def plain(text: str) -> str:
    """TEXT as a plain-text view shows it: escape sequences and controls left out."""
    return _ESCAPES.sub("", text.replace("\r\n", "\n"))


def events(cast: str) -> list[tuple[float, str]]:
    """The output events of the asciicast CAST, as (time, plain text)."""
    found: list[tuple[float, str]] = []
    for line in cast.splitlines()[1:]:
        at, code, data = json.loads(line)
        if code == "o":
            found.append((float(at), plain(data)))
    return found


def add(web: Blueprint, pages: Pages) -> None:
    @web.get("/sessions")
    async def sessions_page() -> Page:
        current = await pages.session()
        scope = current.person.scope
        node = text_arg(request.args, "node")
        person = text_arg(request.args, "person")

        def read(conn: Any) -> tuple[list[node_sessions.Session], list[node_sessions.Session]]:
            live = node_sessions.page(conn, scope=scope, live=True, limit=PAGE)
            recent = node_sessions.page(conn, scope=scope, node_id=node, person=person, limit=PAGE)
            return live, recent

        live, recent = await pages.state.db.transaction(read)
        return await pages.render(
            "sessions.html", current, live=live, recent=recent, node=node, who=person
        )

    @web.get("/sessions/<session_id>")
    async def session_show(session_id: str) -> Page:
        current = await pages.session()
        scope = current.person.scope
        try:
            found = await pages.state.db.transaction(
                lambda conn: node_sessions.get(conn, session_id, scope=scope)
            )
        except node_sessions.SessionNotFound:
            return await pages.missing(current, f"session {session_id}")
        replay: list[tuple[float, str]] | None = None
        key = pages.state.cluster.master_key
        if current.person.has(access.Right.ADMINISTER) and key is not None:
            cast = await pages.state.db.transaction(
                lambda conn: "".join(
                    node_sessions.recording(conn, key, pages.state.cluster.name, found)
                )
            )
            replay = events(cast)
        return await pages.render(
            "session.html",
            current,
            s=found,
            replay=replay,
            screen="".join(text for _, text in replay) if replay is not None else None,
        )
