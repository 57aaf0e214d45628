"""GET and POST /api/v1/tokens, POST /api/v1/tokens/<id>/revoke"""

from __future__ import annotations

from typing import Any, TypedDict

import psycopg
from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0 import access, tenant_caps, tokens
from oz0.cap_rules import CapReached
from oz0.errors import Oz0Error
from oz0.server import join_command
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described


class Tokens(TypedDict):
    tokens: list[tokens.TokenJson]


class NewToken(tokens.TokenJson):
    """A token just made: its secret, shown this once, and the command that joins a node."""

    token: str
    join_command: str
    agent_sha256: str


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/tokens")
    @described("Join tokens (never their secrets)", answers={200: Tokens})
    async def token_list() -> Response:
        scope = (await operator(state)).scope
        rows = await state.db.transaction(lambda conn: tokens.list_tokens(conn, scope=scope))
        return jsonify({"tokens": [t.to_json() for t in rows]})

    @app.post("/api/v1/tokens")
    @described(
        "Make a join token", body=tokens.TokenBody, answers={200: NewToken},
        errors={503: "no server is up to join through"},
    )  # fmt: skip
    async def token_create() -> Response:
        actor = await operator(state)
        body = await json_object()
        try:
            spec = tokens.TokenSpec.from_json(body)
            actor.check(access.Right.OPERATE, "create join tokens", tenant=spec.tenant)
            tokens.check_creator(actor, spec)
            where = await join_command.offer(state.db, state.server_id)

            def create(conn: psycopg.Connection[Any]) -> tuple[tokens.JoinToken, str]:
                tenant_caps.room_for_token(conn, spec.tenant)
                return tokens.create_from(conn, spec, actor)

            token, secret = await state.db.transaction(create)
        except CapReached as e:
            raise ApiError(e.status, str(e)) from None
        except access.Forbidden as e:
            raise ApiError(403, str(e)) from None
        except join_command.NoServerUp as e:
            raise ApiError(503, str(e)) from None
        except Oz0Error as e:
            raise ApiError(400, str(e)) from None
        join = where.command(secret, state.cluster.ca_hash)
        return jsonify(
            {
                **token.to_json(),
                "token": secret,
                "join_command": join.text,
                "agent_sha256": join.agent_sha256,
            }
        )

    @app.post("/api/v1/tokens/<token_id>/revoke")
    @described(
        "Revoke a join token", answers={200: tokens.TokenJson},
        path={"token_id": {"type": "string", "pattern": "^tok-[0-9a-f]{12}$"}},
        errors={404: "no such token (or another tenant's)", 409: "already revoked"},
    )  # fmt: skip
    async def token_revoke(token_id: str) -> Response:
        actor = await operator(state)
        try:
            token = await state.db.transaction(
                lambda conn: tokens.revoke(conn, token_id, actor, scope=actor.scope)
            )
        except tokens.TokenNotFound as e:
            raise ApiError(404, str(e)) from None
        except tokens.TokenAlreadyRevoked as e:
            raise ApiError(409, str(e)) from None
        return jsonify(token.to_json())
