"""The management role: the JSON API the CLI calls on 8443 with operator certificates."""

from __future__ import annotations

import logging
import ssl

import trio
from quart import Response, jsonify
from quart_trio import QuartTrio

from oz0.server.api import audit, cluster, nodes, operators, tenants, tokens
from oz0.server.api.common import ApiError, ManagementState
from oz0.server.https import serve_https
from oz0.store.outage import DATABASE_ERRORS, Outage

log = logging.getLogger(__name__)

MANAGEMENT_PORT = 8443
DATABASE_UNAVAILABLE = (
    "the cluster's database is unavailable; nothing was changed, try again shortly"
)
# Each registers its routes; a new resource is a new module added here.
API_MODULES = (cluster, operators, tenants, tokens, nodes, audit)


def create_app(state: ManagementState) -> QuartTrio:
    app = QuartTrio("oz0.management")

    outage = Outage("the management API's database access", log)

    @app.errorhandler(ApiError)
    async def api_error(error: ApiError) -> tuple[Response, int]:
        return jsonify({"error": error.message}), error.status

    async def database_unavailable(error: Exception) -> tuple[Response, int]:
        # A change and its audit row share one transaction: a failed request changed nothing.
        outage.failed(error)
        return jsonify({"error": DATABASE_UNAVAILABLE}), 503

    for error_class in DATABASE_ERRORS:
        app.register_error_handler(error_class, database_unavailable)

    @app.after_request
    async def database_works(response: Response) -> Response:
        if response.status_code < 500:
            outage.worked()
        return response

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
