"""GET /api/v1/audit: newest first, paged like GET /api/v1/nodes (`limit`, an opaque
`cursor`, `next_cursor` in the answer); `before=ID` (older than that entry) still works."""

from __future__ import annotations

import json
from typing import TypedDict

from quart import Response, request
from quart_trio import QuartTrio

from oz0 import audit, listing
from oz0.server.api.common import ApiError, ManagementState, operator
from oz0.server.api.described import described

DEFAULT_AUDIT_LIMIT = 100
MAX_AUDIT_LIMIT = 10_000


class AuditQuery(TypedDict, total=False):
    limit: int
    cursor: str
    # Older than this entry (an earlier form of cursor).
    before: int
    action: str
    actor: str
    target: str


class AuditPage(TypedDict):
    entries: list[audit.EntryJson]
    next_cursor: str | None


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/audit")
    @described("A page of the audit log, newest first", query=AuditQuery, answers={200: AuditPage})
    async def audit_list() -> Response:
        person = await operator(state)
        args = request.args
        try:
            limit = listing.limit_of(args.get("limit"), DEFAULT_AUDIT_LIMIT, MAX_AUDIT_LIMIT)
            given = args.get("cursor")
            before = audit.before_of(given) if given is not None else None
        except listing.BadPaging as e:
            raise ApiError(400, str(e)) from None
        if "before" in args:
            if given is not None:
                raise ApiError(400, "give cursor or before, not both")
            before = audit.cursor(args.get("before"))
            if before is None:
                raise ApiError(400, "before must be an audit entry's id (a whole number)")
        filters = audit.Filters(args.get("action"), args.get("actor"), args.get("target"))
        rows, next_cursor = await state.db.transaction(
            lambda conn: audit.entries_page_json(
                conn, filters, before=before, limit=limit, scope=person.scope
            )
        )
        # The entries come as JSON text already (see audit.entries_page_json).
        body = '{"entries":[' + ",".join(rows) + '],"next_cursor":' + json.dumps(next_cursor) + "}"
        return Response(body, content_type="application/json")
