"""The management role: the JSON API the CLI calls on 8443 with operator certificates."""

from __future__ import annotations

import logging
import ssl
from functools import partial
from typing import Any

import trio
from quart import Response, jsonify, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from oz0 import pki
from oz0.server.api import (
    agent_file,
    audit,
    cluster,
    health,
    jobs,
    nodes,
    operators,
    tenants,
    tokens,
)
from oz0.server.api import common as api_common
from oz0.server.api.common import ApiError, ManagementState
from oz0.server.https import Served, serve_https
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.web import routes as web_routes
from oz0.web.headers import secure

log = logging.getLogger(__name__)

MANAGEMENT_PORT = 8443
# The CLI resumes its last session on a new connection (cli/client.py): one ticket does.
TLS_TICKETS = 1
MAX_BODY_SIZE = 64 * 1024
BODY_TIMEOUT = 10


class _JsonProvider(DefaultJSONProvider):
    """JSON nested too deeply to parse is bad JSON (a 400), not an error of ours."""

    def loads(self, s: str | bytes, **kwargs: Any) -> Any:
        try:
            return super().loads(s, **kwargs)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


DATABASE_UNAVAILABLE = (
    "the cluster's database is unavailable; nothing was changed, try again shortly"
)

# Each registers its routes; a new resource is a new module added here.
API_MODULES = (
    cluster,
    operators,
    tenants,
    tokens,
    nodes,
    audit,
    jobs,
    agent_file,
    health,
    web_routes,
)


def create_app(state: ManagementState) -> QuartTrio:
    app = QuartTrio("oz0.management")
    app.json = _JsonProvider(app)
    app.config["MAX_CONTENT_LENGTH"] = MAX_BODY_SIZE
    app.config["BODY_TIMEOUT"] = BODY_TIMEOUT
    # A path is what it says: `//` or a missing `/` is a 404, not a redirect to guess.
    app.url_map.merge_slashes = False
    app.url_map.strict_slashes = False

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
        # Probes answer without the database: their success must not end an outage's log.
        if response.status_code < 500 and request.path not in health.WITHOUT_DATABASE:
            outage.worked()
        return response

    @app.errorhandler(UnicodeDecodeError)
    async def not_utf8(_: UnicodeDecodeError) -> tuple[Response, int]:
        # Quart decodes the body before parsing it, outside its own handling of bad JSON.
        return jsonify({"error": "the request body must be JSON in UTF-8"}), 400

    @app.errorhandler(HTTPException)
    async def http_error(error: HTTPException) -> tuple[Response, int]:
        # Unknown paths, wrong methods, bodies over the limit: the same JSON as ours.
        status = error.code or 400
        if web_routes.wants_page():
            page, _ = await web_routes.error_page(
                state, status, error.name, error.description or ""
            )
            return secure(Response(page, status, mimetype="text/html")), status
        return jsonify({"error": f"{status} {error.name}: {error.description}"}), status

    @app.before_request
    async def authorize() -> None:
        await api_common.authorize(state)

    for module in API_MODULES:
        module.register(app, state)
    return app


async def run(
    state: ManagementState,
    tls_context: ssl.SSLContext,
    host: str,
    port: int = MANAGEMENT_PORT,
    *,
    task_status: trio.TaskStatus[Served] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API until cancelled; started with what drains it (`drain`)."""

    def operator_certificate(der: bytes | None) -> bool:
        if der is None:
            return False
        identity = pki.identity_of_der(der)
        return identity.role == pki.Role.OPERATOR and identity.cluster == state.cluster.name

    async with trio.open_nursery() as nursery:
        await nursery.start(state.node_changes.serve)
        served = await nursery.start(
            partial(
                serve_https,
                create_app(state),
                tls_context,
                host,
                port,
                authenticated=operator_certificate,
                on_refused=state.metrics.management_over_limit.inc,
            )
        )
        task_status.started(served)


async def drain(state: ManagementState, served: Served) -> None:
    """Take no new connection and wait for the requests in flight to be answered; the
    web UI's live pages (never answered in full) end at once. Unbounded: the caller
    bounds it."""
    state.stopping.set()
    await served.drain()
