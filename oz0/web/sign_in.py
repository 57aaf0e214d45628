"""`/` (the sign-in page), POST /sign-in and POST /sign-out."""

from __future__ import annotations

from quart import Blueprint, Response, redirect, request

from oz0 import ui_sessions as sessions
from oz0.cap_rules import CapReached
from oz0.web.pages import Page, Pages, Refused


def add(web: Blueprint, pages: Pages) -> None:
    state = pages.state

    @web.get("/")
    async def home() -> Page:
        if await pages.session_or_none() is not None:
            return redirect("/overview")
        return await pages.render("sign_in.html", None, error=None, username="")

    @web.get("/ca.pem")
    async def ca_certificate() -> Page:
        # The web UI CA's certificate, public: the one a browser is asked to trust. Not the
        # cluster CA: its name constraints hold it to the cluster's own names, so trusting
        # it cannot let its key (or the master key) impersonate another site to the browser.
        # The CLI pins the cluster CA from its context, never from here.
        return Response(
            state.cluster.ui_ca_pem,
            mimetype="application/x-pem-file",
            headers={
                "Content-Disposition": f'attachment; filename="{state.cluster.name}-ui-ca.pem"',
                "Cache-Control": "public, max-age=3600",
            },
        )

    async def refused(verdict: sessions.Verdict, username: str) -> Page:
        if verdict.limited:
            error = f"Too many failed sign-ins; try again in {verdict.wait_text()}."
            page, status = await pages.render(
                "sign_in.html", None, 429, error=error, username=username
            )
            return Response(
                page, status, {"Retry-After": str(verdict.retry_after)}, mimetype="text/html"
            )
        return await pages.render(
            "sign_in.html", None, 401, error="Wrong username or password.", username=username
        )

    @web.post("/sign-in")
    async def sign_in() -> Page:
        if not pages.same_origin():
            raise Refused("a sign-in from another site")
        form = await request.form
        username, password = form.get("username", ""), form.get("password", "")
        where = pages.source()
        verdict = await sessions.check_password(
            state.db, pages.hashing, username, password, where, pages.names, pages.pruning
        )
        if not verdict.ok:
            return await refused(verdict, username)
        most = state.limits.web_sessions
        try:
            token, _ = await state.db.transaction(
                lambda conn: sessions.start(conn, username, where, max_open=most)
            )
        except sessions.SignInRefused:
            # Its operator was removed between the password check and now.
            return await refused(sessions.Verdict(False), username)
        except CapReached as e:
            state.metrics.person_cap_hit("web_sessions")
            # Only ever said after the right password: it tells no stranger anything.
            return await pages.render(
                "sign_in.html", None, e.status, error=str(e), username=username
            )
        response = redirect("/overview", 303)
        response.set_cookie(
            sessions.COOKIE, token, secure=True, httponly=True, samesite="Strict", path="/",
            max_age=int(sessions.ABSOLUTE.total_seconds()),
        )  # fmt: skip
        return response

    @web.post("/sign-out")
    async def sign_out() -> Page:
        await pages.posted()
        token = request.cookies.get(sessions.COOKIE)
        await state.db.transaction(lambda conn: sessions.end(conn, token))
        response = redirect("/", 303)
        response.delete_cookie(sessions.COOKIE, path="/", secure=True, httponly=True)
        return response
