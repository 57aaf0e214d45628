"""The web UI's pages, registered on the management app beside the JSON API.

Every page but the sign-in page needs a session; every POST needs the session's CSRF token
and a request from our own origin (Sec-Fetch-Site, else Origin). The pages read and change
through the same functions the JSON API calls (oz0.nodes, oz0.audit, ...), with the actor
`ui:<account>`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from quart import Blueprint, Response, redirect, render_template, request
from quart_trio import QuartTrio
from werkzeug.wrappers.response import Response as WerkzeugResponse

from oz0 import audit, nodes
from oz0.server import membership
from oz0.server.api.common import ManagementState
from oz0.web import sessions
from oz0.web.headers import secure

Page = Response | WerkzeugResponse | str | tuple[str, int]


def blueprint(state: ManagementState) -> Blueprint:
    web = Blueprint(
        "web", __name__, template_folder="templates", static_folder="static",
        static_url_path="/ui/static",
    )  # fmt: skip

    @web.after_request
    async def headers(response: Response) -> Response:
        return secure(response)

    def source() -> str:
        client = request.scope.get("client")
        return str(client[0]) if client else "unknown"

    def same_origin() -> bool:
        fetch_site = request.headers.get("Sec-Fetch-Site")
        if fetch_site is not None:
            return fetch_site == "same-origin"
        origin = request.headers.get("Origin")
        return origin is not None and origin == f"https://{request.host}"

    async def refused(why: str) -> tuple[str, int]:
        return await render_template("refused.html", cluster=state.cluster, why=why), 403

    async def session() -> sessions.Session | None:
        token = request.cookies.get(sessions.COOKIE)
        return await state.db.transaction(lambda conn: sessions.current(conn, token))

    @web.get("/")
    async def home() -> Page:
        if await session() is not None:
            return redirect("/overview")
        return await render_template("sign_in.html", cluster=state.cluster, error=None, username="")

    @web.post("/sign-in")
    async def sign_in() -> Page:
        if not same_origin():
            return await refused("a sign-in from another site")
        form = await request.form
        username, password = form.get("username", ""), form.get("password", "")
        where = source()
        verdict = await state.db.transaction(
            lambda conn: sessions.check_password(conn, username, password, where)
        )
        if not verdict:
            error = (
                "Too many failed sign-ins; wait a few minutes and try again."
                if verdict is None
                else "Wrong username or password."
            )
            page = await render_template(
                "sign_in.html", cluster=state.cluster, error=error, username=username
            )
            return page, 429 if verdict is None else 401
        token, _ = await state.db.transaction(lambda conn: sessions.start(conn, username, where))
        response = redirect("/overview", 303)
        response.set_cookie(
            sessions.COOKIE, token, secure=True, httponly=True, samesite="Strict", path="/",
            max_age=int(sessions.ABSOLUTE.total_seconds()),
        )  # fmt: skip
        return response

    @web.post("/sign-out")
    async def sign_out() -> Page:
        current = await session()
        form = await request.form
        if current is None or not same_origin() or not current.csrf_matches(form.get("csrf")):
            return await refused("a request without this session's token")
        token = request.cookies.get(sessions.COOKIE)
        await state.db.transaction(lambda conn: sessions.end(conn, token))
        response = redirect("/", 303)
        response.delete_cookie(sessions.COOKIE, path="/", secure=True, httponly=True)
        return response

    @web.get("/overview")
    async def overview() -> Page:
        current = await session()
        if current is None:
            return redirect("/")

        def read(conn: Any) -> dict[str, Any]:
            fleet = nodes.list_nodes(conn)
            return {
                "by_state": Counter(n.state for n in fleet),
                "by_tenant": Counter(n.tenant for n in fleet),
                "connected": sum(1 for n in fleet if n.connected),
                "total": len(fleet),
                "servers": membership.servers_up(conn),
                "recent": audit.entries(conn, limit=10),
            }

        facts = await state.db.transaction(read)
        return await render_template(
            "overview.html", session=current, cluster=state.cluster, **facts
        )

    return web


def register(app: QuartTrio, state: ManagementState) -> None:
    app.register_blueprint(blueprint(state))
