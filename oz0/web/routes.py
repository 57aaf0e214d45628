"""The web UI's blueprint, registered on the management app beside the JSON API.

Every page but the sign-in page needs a session (else: to the sign-in page); every POST
needs the session's CSRF token and a request from our own origin (else: 403). Each page
module reads and changes through the same functions the JSON API calls (oz0.nodes,
oz0.audit, ...), with the actor `ui:<account>`.
"""

from __future__ import annotations

from quart import Blueprint, Response, redirect, render_template, request
from quart_trio import QuartTrio
from werkzeug.wrappers.response import Response as WerkzeugResponse

from oz0 import access
from oz0.cap_rules import CapReached
from oz0.server.api.common import ManagementState
from oz0.store.outage import DATABASE_ERRORS
from oz0.web import (
    account,
    admin_pages,
    audit_pages,
    job_pages,
    live,
    node_pages,
    overview,
    schedule_pages,
    session_pages,
    sign_in,
    token_pages,
)
from oz0.web.headers import secure
from oz0.web.pages import NotSignedIn, Pages, Refused, compose_notices

# Requests a person's rate does not count: a live page's stream, held open for minutes
# under a cap of its own (live.py).
UNCOUNTED = frozenset({"web.events"})

# Each adds its pages; a new page is a new module added here.
PAGE_MODULES = (
    sign_in,
    overview,
    live,
    node_pages,
    token_pages,
    job_pages,
    schedule_pages,
    audit_pages,
    session_pages,
    admin_pages,
    account,
)
# What `?done=KEY` may show: the notices of the page modules whose actions redirect back.
NOTICES = compose_notices(
    node_pages.NOTICES,
    token_pages.NOTICES,
    job_pages.NOTICES,
    schedule_pages.NOTICES,
    admin_pages.NOTICES,
    account.NOTICES,
)


def blueprint(state: ManagementState) -> Blueprint:
    web = Blueprint(
        "web", __name__, template_folder="templates", static_folder="static",
        static_url_path="/ui/static",
    )  # fmt: skip
    pages = Pages(state, NOTICES)

    @web.before_request
    async def authorize() -> None:
        # Deny by default: a page the rule table does not name is refused, and so is one
        # whose right the person's role lacks (the page has no button for it either).
        rule = access.rule_of(request.endpoint)
        if rule is None:
            raise Refused("a page no rule allows")
        if rule.right is access.Right.PUBLIC:
            return
        session = await pages.session()
        if request.endpoint not in UNCOUNTED:
            state.take_request(session.username)
        try:
            session.person.check(rule.right, rule.doing)
        except access.Forbidden as e:
            raise Refused(str(e)) from None

    @web.after_request
    async def headers(response: Response) -> Response:
        return secure(response)

    @web.errorhandler(NotSignedIn)
    async def not_signed_in(_: NotSignedIn) -> WerkzeugResponse:
        return redirect("/", 303)

    @web.errorhandler(CapReached)
    async def cap_reached(error: CapReached) -> Response:
        page, status = await error_page(state, error.status, "Not now", str(error))
        answer = Response(page, status, mimetype="text/html")
        if error.retry_after is not None:
            answer.headers["Retry-After"] = str(error.retry_after)
        return answer

    @web.errorhandler(Refused)
    async def refused(error: Refused) -> tuple[str, int]:
        page = await render_template("refused.html", cluster=state.cluster, why=error.why)
        return page, 403

    async def database_unavailable(_: Exception) -> tuple[str, int]:
        return await error_page(
            state, 503, "Try again shortly",
            "The cluster's database is unavailable right now; nothing was changed.",
        )  # fmt: skip

    for error_class in DATABASE_ERRORS:
        web.register_error_handler(error_class, database_unavailable)

    for module in PAGE_MODULES:
        module.add(web, pages)
    return web


def wants_page() -> bool:
    """Whether the request came from a browser for a page, not from the CLI for JSON."""
    # Named outright: curl's and most clients' `*/*` keep getting JSON.
    accept = request.headers.get("Accept", "")
    return not request.path.startswith("/api/") and "text/html" in accept


async def error_page(state: ManagementState, status: int, title: str, text: str) -> tuple[str, int]:
    page = await render_template(
        "error.html", cluster=state.cluster, server_id=state.server_id, title=title, text=text
    )
    return page, status


def register(app: QuartTrio, state: ManagementState) -> None:
    app.register_blueprint(blueprint(state))
