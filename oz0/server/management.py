"""The management role: the JSON API the CLI calls on 8443 with operator certificates."""

from __future__ import annotations

import ssl

import trio
from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0.server.api import audit, cluster, nodes, operators, tenants, tokens
from oz0.server.api.common import ApiError, ManagementState
from oz0.server.https import serve_https

MANAGEMENT_PORT = 8443
# Each registers its routes; a new resource is a new module added here.
API_MODULES = (cluster, operators, tenants, tokens, nodes, audit)


def create_app(state: ManagementState) -> QuartTrio:
    app = QuartTrio("oz0.management")

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> tuple[Response, int]:
        return jsonify({"error": error.message}), error.status

    for module in API_MODULES:
        module.register(app, state)
    return app


async def run(
    state: ManagementState,
    tls_context: ssl.SSLContext,
    host: str,
    port: int = MANAGEMENT_PORT,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    await serve_https(create_app(state), tls_context, host, port, task_status=task_status)
