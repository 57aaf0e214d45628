"""GET /api/v1/sessions (newest first; `node`, `person`, `live`, `limit`),
GET /api/v1/sessions/<id>, GET /api/v1/sessions/<id>/recording (its asciicast v2 file,
as `asciicast` in a JSON object).

That a session happened (who, where, when, how it ended, how many bytes) is for whoever
reads its tenant; what it showed, its recording, for the tenant's admins only (the rule
table: oz0/access.py).
"""

from __future__ import annotations

from typing import TypedDict

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import listing, node_sessions
from oz0.errors import WrongMasterKey
from oz0.server.api.common import ApiError, ManagementState, operator
from oz0.server.api.described import described

_NOT_FOUND = {404: "no such session (or another tenant's)"}
_SESSION_ID = {"session_id": {"type": "string", "pattern": "^session-[0-9a-f]{12}$"}}


class SessionQuery(TypedDict, total=False):
    limit: int
    node: str
    person: str
    # "true": only sessions going on.
    live: str


class Sessions(TypedDict):
    sessions: list[node_sessions.SessionJson]


class SessionRecording(TypedDict):
    id: str
    # asciicast v2: what the session showed (and, where recorded, what was typed).
    asciicast: str


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/sessions")
    @described("Sessions on nodes, newest first", query=SessionQuery, answers={200: Sessions})
    async def session_list() -> Response:
        person = await operator(state)
        args = request.args
        try:
            limit = listing.limit_of(
                args.get("limit"), node_sessions.DEFAULT_LIMIT, node_sessions.MAX_LIMIT
            )
        except listing.BadPaging as e:
            raise ApiError(400, str(e)) from None
        found = await state.db.transaction(
            lambda conn: node_sessions.page(
                conn, scope=person.scope, node_id=args.get("node"), person=args.get("person"),
                live=args.get("live") == "true", limit=limit,
            )
        )  # fmt: skip
        return jsonify({"sessions": [s.to_json() for s in found]})

    @app.get("/api/v1/sessions/<session_id>")
    @described(
        "A session's record", answers={200: node_sessions.SessionJson}, path=_SESSION_ID,
        errors=_NOT_FOUND,
    )  # fmt: skip
    async def session_show(session_id: str) -> Response:
        person = await operator(state)
        found = await _get(state, session_id, person.scope)
        return jsonify(found.to_json())

    @app.get("/api/v1/sessions/<session_id>/recording")
    @described(
        "What a session showed (admins only)", answers={200: SessionRecording}, path=_SESSION_ID,
        errors={**_NOT_FOUND, 503: "this server does not hold the master key"},
    )  # fmt: skip
    async def session_recording(session_id: str) -> Response:
        person = await operator(state)
        text = await recording_text(state, session_id, person.scope)
        return jsonify({"id": session_id, "asciicast": text})


async def _get(
    state: ManagementState, session_id: str, scope: listing.Scope
) -> node_sessions.Session:
    try:
        return await state.db.transaction(
            lambda conn: node_sessions.get(conn, session_id, scope=scope)
        )
    except node_sessions.SessionNotFound as e:
        raise ApiError(404, str(e)) from None


async def recording_text(state: ManagementState, session_id: str, scope: listing.Scope) -> str:
    """The session's asciicast v2 file (also the web UI's, oz0/web/session_pages.py)."""
    found = await _get(state, session_id, scope)
    key = state.cluster.master_key
    if key is None:
        raise ApiError(503, "this server does not hold the master key: it cannot read recordings")
    try:
        return await state.db.transaction(
            lambda conn: "".join(node_sessions.recording(conn, key, state.cluster.name, found))
        )
    except WrongMasterKey as e:
        raise ApiError(500, f"session {session_id}'s recording does not unseal: {e}") from None
