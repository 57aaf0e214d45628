"""The management role: the JSON API the CLI calls on 8443 with operator certificates."""

from __future__ import annotations

import logging
import re
import ssl
from functools import partial
from typing import Any

import psycopg
import trio
from quart import Response, jsonify, request
from quart.json.provider import DefaultJSONProvider
from quart_trio import QuartTrio
from quart_trio.wrappers.request import TrioRequest
from werkzeug.exceptions import HTTPException

from oz0 import pki
from oz0.cap_rules import CapReached
from oz0.operators import is_current, is_known
from oz0.server.api import (
    agent_file,
    audit,
    cluster,
    events,
    files,
    health,
    jobs,
    nodes,
    openapi,
    operators,
    schedules,
    session_records,
    sessions,
    tenants,
    tokens,
)
from oz0.server.api import common as api_common
from oz0.server.api.common import ApiError, ManagementState
from oz0.server.https import Served, serve_https
from oz0.store.events import OPERATORS, EventHub
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.web import routes as web_routes
from oz0.web.headers import secure
from oz0_common.addresses import MANAGEMENT_PORT

log = logging.getLogger(__name__)

# The CLI resumes its last session on a new connection (cli/client.py): one ticket does.
TLS_TICKETS = 1
MAX_BODY_SIZE = 64 * 1024
# One route takes more: a pushed file's upload, CHUNKS_PER_UPLOAD rows (1 MiB) in base64 a
# request, so that a 10 MiB file is 10 requests, not 320 (UploadRequest).
UPLOAD_BODY_SIZE = 1536 * 1024
_UPLOAD_PATH = re.compile(r"^/api/v1/files/[0-9a-f]{64}/chunks$")
# A check of open operator connections that failed (the database away) is tried again after.
CHECK_AGAIN_AFTER = 1.0
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
    events,
    jobs,
    files,
    schedules,
    sessions,
    session_records,
    agent_file,
    health,
    openapi,
    web_routes,
)


class UploadRequest(TrioRequest):
    """A request whose body may be up to UPLOAD_BODY_SIZE if it is a file's chunks' upload,
    else MAX_BODY_SIZE as any (the app's MAX_CONTENT_LENGTH): Quart sets one limit for
    every route, so the one route that needs more says so here, by its method and path."""

    def __init__(self, method: str, scheme: str, path: str, *args: Any, **kwargs: Any) -> None:
        super().__init__(method, scheme, path, *args, **kwargs)
        if method == "POST" and _UPLOAD_PATH.fullmatch(path):
            self.body = self.body_class(self.content_length, UPLOAD_BODY_SIZE)


def create_app(state: ManagementState) -> QuartTrio:
    app = QuartTrio("oz0.management")
    app.request_class = UploadRequest
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

    @app.errorhandler(CapReached)
    async def cap_reached(error: CapReached) -> Response:
        answer = jsonify({"error": api_common.one_line(str(error))})
        answer.status_code = error.status
        if error.retry_after is not None:
            answer.headers["Retry-After"] = str(error.retry_after)
        return answer

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
        text = api_common.one_line(f"{status} {error.name}: {error.description}")
        return jsonify({"error": text}), status

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

    with state.subscribed():
        async with trio.open_nursery() as nursery:
            await nursery.start(state.node_changes.serve)
            served = await nursery.start(
                partial(
                    serve_https,
                    create_app(state),
                    tls_context,
                    host,
                    port,
                    on_refused=state.metrics.management_over_limit.inc,
                )
            )
            if state.hub is not None:
                await nursery.start(OperatorConnections(state, served, state.hub).run)
            task_status.started(served)


class OperatorConnections:
    """Cuts the open connections of an operator certificate once it is not current: its
    operator removed, or given a new certificate (`server operator issue`, a renewal).

    Every such change notifies `oz0_operators` with the operator's name, on every server;
    the open connections of that name are then checked against the database (a change of
    role or tenants leaves the certificate current: its connections stay). A LISTEN gap
    (notifications may be lost) checks every operator connection.
    """

    def __init__(self, state: ManagementState, served: Served, hub: EventHub) -> None:
        self._state = state
        self._served = served
        self._hub = hub
        self._names: set[str] = set()
        self._everyone = False
        self._woken = trio.Event()

    def _notified(self, notification: Notification) -> None:
        self._names.add(notification.payload)
        self._woken.set()

    def _gap(self) -> None:
        self._everyone = True
        self._woken.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._hub.subscription(OPERATORS, notified=self._notified, on_gap=self._gap):
            task_status.started()
            while True:
                await self._woken.wait()
                self._woken = trio.Event()
                names, self._names = self._names, set()
                everyone, self._everyone = self._everyone, False
                try:
                    await self._check(names, everyone)
                except DATABASE_ERRORS as e:
                    # Their next request is refused all the same (the cache forgot them); the
                    # connections are checked again shortly.
                    log.warning("could not check open operator connections: %s", e)
                    self._names |= names
                    self._everyone |= everyone
                    await trio.sleep(CHECK_AGAIN_AFTER)
                    self._woken.set()

    async def _check(self, names: set[str], everyone: bool) -> None:
        by_identity: dict[pki.Identity, list[bytes]] = {}
        for der in self._served.certificates():
            identity = pki.identity_of_der(der)
            if api_common.is_operator_of(self._state, identity) and (
                everyone or identity.name in names
            ):
                by_identity.setdefault(identity, []).append(der)
        if not by_identity:
            return

        def not_current(conn: psycopg.Connection[Any]) -> list[tuple[pki.Identity, bool]]:
            return [(i, is_known(conn, i.name)) for i in by_identity if not is_current(conn, i)]

        for identity, replaced in await self._state.db.transaction(not_current):
            # A replaced certificate's requests in flight are answered first: one of them
            # may be the renewal, whose answer carries the new certificate. A removed
            # operator's end now.
            cut = sum(
                self._served.cut(der, after_requests=replaced) for der in by_identity[identity]
            )
            log.info(
                "cut %d connection(s) of operator %s: its certificate %x is no longer current",
                cut,
                identity.name,
                identity.serial,
            )


async def drain(state: ManagementState, served: Served) -> None:
    """Take no new connection and wait for the requests in flight to be answered; the
    web UI's live pages (never answered in full) end at once. Unbounded: the caller
    bounds it."""
    state.stopping.set()
    await served.drain()
