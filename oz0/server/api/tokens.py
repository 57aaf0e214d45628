"""GET and POST /api/v1/tokens, POST /api/v1/tokens/<id>/revoke"""

from __future__ import annotations

from typing import Any

from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import tokens
from oz0.errors import Oz0Error
from oz0.server.api.common import ApiError, ManagementState, json_object, operator

DEFAULT_TTL = "24h"
DEFAULT_MAX_USES = 1


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/tokens")
    async def token_list() -> Response:
        await operator(state)
        rows = await state.db.transaction(tokens.list_tokens)
        return jsonify({"tokens": [t.to_json() for t in rows]})

    @app.post("/api/v1/tokens")
    async def token_create() -> Response:
        actor = await operator(state)
        body = await json_object()
        tenant = body.get("tenant")
        if not isinstance(tenant, str):
            raise ApiError(400, "body must be a JSON object with a `tenant`")
        ttl_text = body.get("ttl", DEFAULT_TTL)
        if not isinstance(ttl_text, str):
            raise ApiError(400, "`ttl` must be a string such as 24h, or 0 for never")
        max_uses = body.get("max_uses", DEFAULT_MAX_USES)
        if not isinstance(max_uses, int) or isinstance(max_uses, bool):
            raise ApiError(400, "`max_uses` must be a whole number, 0 for unlimited")
        labels = _labels(body.get("labels", {}))
        description = body.get("description", "")
        if not isinstance(description, str):
            raise ApiError(400, "`description` must be a string")
        try:
            ttl = tokens.parse_ttl(ttl_text)
            token, secret = await state.db.transaction(
                lambda conn: tokens.create(
                    conn,
                    tenant=tenant,
                    ttl=ttl,
                    max_uses=max_uses,
                    labels=labels,
                    description=description,
                    actor=actor,
                )
            )
        except Oz0Error as e:
            raise ApiError(400, str(e)) from None
        return jsonify({**token.to_json(), "token": secret})

    @app.post("/api/v1/tokens/<token_id>/revoke")
    async def token_revoke(token_id: str) -> Response:
        actor = await operator(state)
        try:
            token = await state.db.transaction(lambda conn: tokens.revoke(conn, token_id, actor))
        except tokens.TokenNotFound as e:
            raise ApiError(404, str(e)) from None
        except tokens.TokenAlreadyRevoked as e:
            raise ApiError(409, str(e)) from None
        return jsonify(token.to_json())


def _labels(value: Any) -> dict[str, str]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise ApiError(400, "`labels` must be a JSON object of strings")
    return value
