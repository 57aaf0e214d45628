"""GET and PATCH /api/v1/cluster"""

from __future__ import annotations

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import audit, membership
from oz0 import retention_rules as rules
from oz0.server.api.common import ApiError, ManagementState, json_object, operator


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/cluster")
    async def cluster_info() -> Response:
        await operator(state)
        servers, kept = await state.db.transaction(
            lambda conn: (membership.servers_up(conn), audit.retention(conn))
        )
        return jsonify(
            {
                "name": state.cluster.name,
                "ca_hash": state.cluster.ca_hash,
                "servers": [s.to_json() for s in servers],
                **_settings(kept),
            }
        )

    @app.patch("/api/v1/cluster")
    async def cluster_set() -> Response:
        actor = await operator(state)
        body = await json_object()
        if "audit_retention" not in body:
            raise ApiError(400, "nothing to change: give audit_retention")
        value = body["audit_retention"]
        try:
            if value is not None and (isinstance(value, bool) or not isinstance(value, str | int)):
                raise rules.RetentionError("audit_retention must be seconds, a duration or keep")
            seconds = rules.audit_retention(value)
        except rules.RetentionError as e:
            raise ApiError(400, str(e)) from None
        await state.db.transaction(lambda conn: audit.set_retention(conn, seconds, actor))
        return jsonify(_settings(seconds))


def _settings(audit_retention: int | None) -> dict[str, object]:
    return {
        "audit_retention": rules.describe(audit_retention),
        "audit_retention_seconds": audit_retention,
    }
