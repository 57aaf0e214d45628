"""/sessions: sessions on nodes, the live ones first; /sessions/ID: one, and for the
admins of its tenant its recording in a terminal view: the screen it left (what a VT100
emulator fed its output shows: oz0/web/terminal_frames.py), played back from the start by
session-replay.js with the frames of /sessions/ID/frames.json, a page at a time."""

from __future__ import annotations

import contextlib
from typing import Any

import trio
from quart import Blueprint, Response, jsonify, request

from oz0 import access, node_sessions
from oz0.web import terminal_frames
from oz0.web.pages import Page, Pages, text_arg

PAGE = 100
# Recordings rendered at once by this server (each a thread, pyte's work is the CPU's).
RENDERERS = 2


def add(web: Blueprint, pages: Pages) -> None:
    rendering = trio.CapacityLimiter(RENDERERS)

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

    async def events(found: node_sessions.Session) -> terminal_frames.Events:
        """FOUND's recording as far as the replay goes (the rest is not read)."""
        key = pages.state.cluster.master_key
        assert key is not None

        def read(conn: Any) -> terminal_frames.Events:
            lines = node_sessions.recording(conn, key, pages.state.cluster.name, found)
            with contextlib.closing(lines):
                return terminal_frames.read(lines)

        return await pages.state.db.transaction(read)

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
        screen: list[list[terminal_frames.Run]] | None = None
        recorded: terminal_frames.Events | None = None
        unreadable: str | None = None
        if current.person.has(access.Right.ADMINISTER) and pages.state.cluster.master_key:
            try:
                recorded = await events(found)
            except terminal_frames.BadRecording as e:
                unreadable = str(e)
            else:
                last = await trio.to_thread.run_sync(
                    terminal_frames.last_frame, recorded, limiter=rendering
                )
                screen = terminal_frames.html_lines(last)
        return await pages.render(
            "session.html",
            current,
            s=found,
            screen=screen,
            recorded=recorded,
            unreadable=unreadable,
            replay_limit=terminal_frames.REPLAY_OUTPUT,
        )

    @web.get("/sessions/<session_id>/frames.json")
    async def session_frames(session_id: str) -> tuple[Response, int]:
        # Its tenant's admins only (the rule table, oz0/access.py).
        current = await pages.session()
        try:
            number = int(request.args.get("page", "0"))
        except ValueError:
            number = -1
        if number < 0:
            return jsonify({"error": "page must be a whole number, 0 or more"}), 400
        try:
            found = await pages.state.db.transaction(
                lambda conn: node_sessions.get(conn, session_id, scope=current.person.scope)
            )
        except node_sessions.SessionNotFound as e:
            return jsonify({"error": str(e)}), 404
        if not pages.state.cluster.master_key:
            return jsonify({"error": "this server cannot read recordings"}), 503
        try:
            recorded = await events(found)
        except terminal_frames.BadRecording as e:
            return jsonify({"error": str(e)}), 500
        shown = await trio.to_thread.run_sync(
            terminal_frames.page, recorded, number, limiter=rendering
        )
        if shown is None:
            return jsonify({"error": f"session {session_id}'s replay has no page {number}"}), 404
        return jsonify(shown.to_json()), 200
