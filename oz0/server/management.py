"""The management role: the JSON API the CLI calls on 8443 with operator certificates."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import trio
from cryptography import x509
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import audit, operators, pki, tenants
from oz0.cluster import Cluster
from oz0.errors import Oz0Error
from oz0.server import membership
from oz0.server.https import peer_cert_der, serve_https
from oz0.store.pool import Database
from oz0.temporal.role import Temporal

log = logging.getLogger(__name__)

MANAGEMENT_PORT = 8443
MAX_AUDIT_LIMIT = 10_000


@dataclass(frozen=True)
class ManagementState:
    db: Database
    cluster: Cluster
    server_id: str
    temporal: Temporal


class ApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def _operator(state: ManagementState) -> pki.Identity:
    """The operator calling, from the client certificate; ApiError if not one we trust."""
    der = peer_cert_der(request.scope)
    if der is None:
        raise ApiError(401, "an operator client certificate is required")
    identity = pki.identity_of(x509.load_der_x509_certificate(der))
    if identity.role != pki.Role.OPERATOR or identity.cluster != state.cluster.name:
        raise ApiError(403, "this certificate does not belong to an operator of this cluster")
    known = await state.db.transaction(lambda conn: operators.is_current(conn, identity))
    if not known:
        raise ApiError(
            403,
            f"operator {identity.name} is unknown or this certificate was replaced; "
            "get new credentials with `orchestrator-zero server operator issue`",
        )
    return identity


def create_app(state: ManagementState) -> QuartTrio:
    app = QuartTrio("oz0.management")

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> tuple[Response, int]:
        return jsonify({"error": error.message}), error.status

    @app.get("/api/v1/cluster")
    async def cluster_info() -> Response:
        await _operator(state)
        servers = await state.db.transaction(membership.servers_up)
        return jsonify(
            {
                "name": state.cluster.name,
                "ca_hash": state.cluster.ca_hash,
                "servers": [s.to_json() for s in servers],
            }
        )

    @app.post("/api/v1/operator/renew")
    async def operator_renew() -> Response:
        caller = await _operator(state)
        body: Any = await request.get_json(force=True, silent=True)
        if not isinstance(body, dict) or not isinstance(body.get("csr"), str):
            raise ApiError(400, "body must be a JSON object with a PEM `csr`")
        try:
            public_key = pki.csr_public_key(body["csr"].encode())
        except ValueError as e:
            raise ApiError(400, f"bad certificate request: {e}") from None
        actor = audit.Actor("operator", caller.name)
        cert = await state.db.transaction(
            lambda conn: operators.issue_certificate(
                conn,
                state.cluster.cluster_ca,
                caller.name,
                public_key,
                actor=actor,
                action="operator.renew",
            )
        )
        return jsonify(
            {
                "certificate": pki.cert_to_pem(cert).decode(),
                "not_after": cert.not_valid_after_utc.isoformat(),
            }
        )

    @app.get("/api/v1/tenants")
    async def tenant_list() -> Response:
        await _operator(state)
        rows = await state.db.transaction(tenants.list_tenants)
        return jsonify({"tenants": [t.to_json() for t in rows]})

    @app.post("/api/v1/tenants")
    async def tenant_create() -> Response:
        caller = await _operator(state)
        body: Any = await request.get_json(force=True, silent=True)
        name = body.get("name") if isinstance(body, dict) else None
        if not isinstance(name, str):
            raise ApiError(400, "body must be a JSON object with a `name`")
        try:
            tenants.check_name(name)
        except Oz0Error as e:
            raise ApiError(400, str(e)) from None
        if await state.db.transaction(lambda conn: tenants.exists(conn, name)):
            raise ApiError(409, f"tenant {name} already exists")
        # The namespace first: registering is idempotent, so a failure after it leaves
        # nothing a retry would trip over, while a tenant row without a namespace would.
        try:
            await state.temporal.ensure_namespaces([name])
        except Exception as e:
            log.warning("registering namespace %s failed: %r", name, e)
            raise ApiError(503, f"could not register Temporal namespace {name}: {e}") from None
        actor = audit.Actor("operator", caller.name)
        try:
            tenant = await state.db.transaction(lambda conn: tenants.create(conn, name, actor))
        except tenants.TenantExists as e:
            raise ApiError(409, str(e)) from None
        return jsonify(tenant.to_json())

    @app.get("/api/v1/audit")
    async def audit_list() -> Response:
        await _operator(state)
        try:
            limit = int(request.args.get("limit", "100"))
        except ValueError:
            raise ApiError(400, "limit must be a whole number") from None
        if not 1 <= limit <= MAX_AUDIT_LIMIT:
            raise ApiError(400, f"limit must be between 1 and {MAX_AUDIT_LIMIT}")
        action, target = request.args.get("action"), request.args.get("target")
        rows = await state.db.transaction(
            lambda conn: audit.entries(conn, action=action, target=target, limit=limit)
        )
        return jsonify({"entries": [r.to_json() for r in rows]})

    return app


async def run(
    state: ManagementState,
    tls_context: Any,
    host: str,
    port: int = MANAGEMENT_PORT,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve_https(create_app(state), tls_context, host, port, task_status=task_status)
