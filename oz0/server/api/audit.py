"""GET /api/v1/audit"""

from __future__ import annotations

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import audit
from oz0.server.api.common import ApiError, ManagementState, operator

MAX_AUDIT_LIMIT = 10_000


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/audit")
    async def audit_list() -> Response:
        await operator(state)
        try:
            limit = int(request.args.get("limit", "100"))
        except ValueError:
            raise ApiError(400, "limit must be a whole number") from None
        if not 1 <= limit <= MAX_AUDIT_LIMIT:
            raise ApiError(400, f"limit must be between 1 and {MAX_AUDIT_LIMIT}")
        before = audit.cursor(request.args.get("before"))
        if before is None and "before" in request.args:
            raise ApiError(400, "before must be an audit entry's id (a whole number)")
        args = request.args
        rows = await state.db.transaction(
            lambda conn: audit.entries(
                conn,
                action=args.get("action"),
                actor=args.get("actor"),
                target=args.get("target"),
                before=before,
                limit=limit,
            )
        )
        return jsonify({"entries": [r.to_json() for r in rows]})
