"""What every API module shares: the state, errors, the calling operator, request bodies."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import trio
from quart import g, request

from oz0 import access, nodes, operators, pki
from oz0.cap_rules import CapReached
from oz0.cluster import Cluster
from oz0.server import https
from oz0.server.api.operator_cache import OperatorCache
from oz0.server.audit_follow import Followers
from oz0.server.https import peer_cert_der
from oz0.server.metrics import ServerMetrics
from oz0.server.person_limits import PersonLimits
from oz0.server.readiness import Readiness
from oz0.server.session_relay import SessionRelay
from oz0.store.batches import Batches
from oz0.store.events import EventHub
from oz0.store.pool import Database
from oz0.temporal.namespaces import InNamespace
from oz0.temporal.role import Temporal

if TYPE_CHECKING:
    # The web UI's module imports this one (its pages read the state): named for the
    # checker only; the server's composition root (start.py) makes the feed.
    from oz0.web.live import Feed


@dataclass(frozen=True)
class ManagementState:
    db: Database
    cluster: Cluster
    server_id: str
    temporal: Temporal
    metrics: ServerMetrics
    readiness: Readiness
    # Tells this server's job sweeper to look now (a job was created or cancelled).
    kick_jobs: Callable[[], None] = lambda: None
    # This server's Temporal calls in a tenant's namespace (the job role's), for schedules;
    # None: schedules are unavailable here.
    in_namespace: InNamespace | None = None
    # This server's notifications, for the web UI's live updates (None: no live updates).
    hub: EventHub | None = None
    # Operator certificates found current a moment ago (see operator_cache).
    operator_cache: OperatorCache = field(default_factory=OperatorCache)
    # Single-node blocks and unblocks that arrive together share a transaction (served by
    # management.run; until then each has its own).
    node_changes: Batches = field(init=False)
    # Set when the server begins to stop: what never ends by itself (a live page) ends.
    stopping: trio.Event = field(default_factory=trio.Event)
    # What one person may hold or ask of this server (`server start` flags).
    limits: PersonLimits = field(default_factory=PersonLimits)
    # The node streams this server's edge holds, for the sessions relayed through them.
    sessions: SessionRelay = field(default_factory=SessionRelay)
    # The audit log's streams (GET /api/v1/events) and the web UI's live pages open here,
    # with what one person may hold of them (`limits`).
    followers: Followers = field(kw_only=True)
    live_pages: Feed = field(kw_only=True)

    def take_request(self, person: str) -> None:
        """One request of PERSON's (the API's or the web UI's); CapReached past their rate,
        counted in the metrics."""
        try:
            self.limits.take_request(person, trio.current_time())
        except CapReached:
            self.metrics.person_cap_hit("requests")
            raise

    def __post_init__(self) -> None:
        changes = Batches(self.db, (nodes.NodeError,), together=nodes.write_changes)
        object.__setattr__(self, "node_changes", changes)

    @contextmanager
    def subscribed(self) -> Iterator[None]:
        """What the API holds that hears the hub (the operator cache, the audit log's and
        the live pages' streams) subscribed while the block runs: the API's serving."""
        with ExitStack() as held:
            if self.hub is not None:
                held.enter_context(self.operator_cache.subscribed(self.hub))
                held.enter_context(self.followers.subscribed(self.hub))
                held.enter_context(self.live_pages.subscribed(self.hub))
            yield


API_PREFIX = "/api/"
JSON = "application/json"
# `Sec-Fetch-Site` values of requests a page of another site did not make: our own pages,
# and what the user typed or bookmarked.
ALLOWED_FETCH_SITES = frozenset({"same-origin", "none"})


class ApiError(Exception):
    """Answered as `{"error": message}` with STATUS; the CLI prints the message."""

    def __init__(self, status: int, message: str) -> None:
        self.message = one_line(message)
        super().__init__(self.message)
        self.status = status


def one_line(text: str) -> str:
    """TEXT with each character that would break its line or drive a terminal (a newline,
    an escape, another control) written as its escape: an error is one line, and what a
    caller sent that it names (an ID, a name) is shown, never obeyed."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


async def operator(state: ManagementState) -> access.Person:
    """The operator calling, from the client certificate (its role and tenants); ApiError if
    not one we trust. Found once per request (`authorize` finds it before the handler)."""
    found: access.Person | None = g.get("person")
    if found is not None:
        return found
    der = peer_cert_der(request.scope)
    if der is None:
        raise ApiError(401, "an operator client certificate is required")
    identity = pki.identity_of_der(der)
    if not is_operator_of(state, identity):
        raise ApiError(403, "this certificate does not belong to an operator of this cluster")
    person = await current_person(state, identity)
    if person is None:
        raise _unknown(identity)
    # Only an operator's current certificate frees its connection's place among the
    # unauthenticated: a removed or replaced one holds a stranger's.
    https.authenticated(request.scope)
    g.person = person
    return person


def is_operator_of(state: ManagementState, identity: pki.Identity) -> bool:
    """Whether IDENTITY is an operator's certificate of this cluster (current or not)."""
    return identity.role == pki.Role.OPERATOR and identity.cluster == state.cluster.name


async def current_person(state: ManagementState, identity: pki.Identity) -> access.Person | None:
    """Who the operator certificate IDENTITY is, if it is its operator's current one (from
    the cache, else the database); None if not."""
    return await state.operator_cache.confirmed(
        identity, lambda: state.db.transaction(lambda conn: operators.person_of(conn, identity))
    )


async def authorize(state: ManagementState) -> None:
    """Before every API request: refuse a route the rule table does not name (deny by
    default), a caller past its requests a second (429), and a caller whose role lacks the
    route's right (403, one line). Web pages are checked by their blueprint
    (oz0/web/routes.py), with a session for a certificate."""
    if request.routing_exception is not None:
        return  # 404 or 405: answered as such
    refuse_nul()
    if request.path.startswith(API_PREFIX):
        refuse_cross_site()
    endpoint = request.endpoint or ""
    rule = access.rule_of(endpoint)
    if rule is None:
        raise ApiError(403, f"no rule allows {request.method} {request.path}")
    if rule.right is access.Right.PUBLIC or endpoint.startswith("web."):
        return
    person = await operator(state)
    # CapReached past the person's rate: answered 429 (management.py).
    state.take_request(person.name)
    try:
        person.check(rule.right, rule.doing)
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None


def _unknown(identity: pki.Identity) -> ApiError:
    return ApiError(
        403,
        f"operator {identity.name} is unknown or this certificate was replaced; "
        "get new credentials with `orchestrator-zero server operator issue`",
    )


def refuse_cross_site() -> None:
    """Refuse what a page of another site can make a browser send with the operator's
    certificate (cross-site request forgery): a request its browser marks as cross-site
    (`Sec-Fetch-Site`; the CLI and curl send none), and a change whose body is not declared
    JSON. A browser sends `text/plain` or a form to another site without asking it first;
    `Content-Type: application/json` it sends only after a CORS preflight, which this API
    never allows."""
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site not in ALLOWED_FETCH_SITES:
        raise ApiError(403, f"a request from another site ({site}) is refused")
    if request.method in ("GET", "HEAD", "OPTIONS"):
        return
    if request.method == "POST" or _has_body():
        _require_json()


def refuse_nul() -> None:
    """PostgreSQL's text holds no NUL character: a path or query with one is bad input
    (400), not an error of ours when a query meets it."""
    args = request.args.items(multi=True)
    if "\x00" in request.path or any("\x00" in k or "\x00" in v for k, v in args):
        raise ApiError(400, "a NUL character (\\x00) is not allowed in a path or query")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _has_body() -> bool:
    return request.content_length not in (None, 0) or "Transfer-Encoding" in request.headers


def _require_json() -> None:
    if request.mimetype != JSON:
        sent = request.mimetype or "none"
        raise ApiError(415, f"send the request body as JSON (Content-Type: {JSON}, not {sent})")


async def json_object() -> dict[str, Any]:
    # Checked before every request already (refuse_cross_site), and again here for what
    # reads a body: nothing else is parsed as JSON.
    _require_json()
    body: Any = await request.get_json(silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    if _has_nul(body):
        raise ApiError(400, "a NUL character (\\u0000) is not allowed in the request body")
    return body
