"""/account: the signed-in account, and Change password (the current one checked as a
sign-in is, so a wrong one counts toward the same rate limit)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

import trio
from quart import Blueprint, request

from oz0 import passwords, ui_accounts
from oz0 import ui_sessions as sessions
from oz0.web.pages import Page, Pages

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {"account.password_changed": "Password changed. Your other sessions have been signed out."}
)


def add(web: Blueprint, pages: Pages) -> None:
    state = pages.state
    # The dummy hash an unknown username is checked against: made now, not at first use.
    sessions.warm_up()

    async def account_page(
        current: sessions.Session, status: int = 200, error: str | None = None
    ) -> Page:
        username = current.username
        signed_in = await state.db.transaction(lambda conn: sessions.count_open(conn, username))
        return await pages.render(
            "account.html",
            current,
            status,
            error=error,
            signed_in=signed_in,
            min_length=ui_accounts.MIN_PASSWORD,
            idle=int(sessions.IDLE.total_seconds() // 60),
            absolute=int(sessions.ABSOLUTE.total_seconds() // 3600),
        )

    @web.get("/account")
    async def account() -> Page:
        return await account_page(await pages.session())

    @web.post("/account/password")
    async def change_password() -> Page:
        current, form = await pages.posted()
        try:
            new = ui_accounts.check_new(form.get("new", ""), form.get("again", ""))
        except ui_accounts.PasswordRefused as e:
            return await account_page(current, 400, str(e))
        given, where = form.get("current", ""), pages.source()
        token = request.cookies.get(sessions.COOKIE)
        username = current.username
        verdict = await sessions.check_password(
            state.db, pages.hashing, username, given, where, pages.names, pages.pruning
        )
        if verdict.limited:
            return await account_page(
                current, 429, f"Too many failed sign-ins; try again in {verdict.wait_text()}."
            )
        if not verdict.ok:
            return await account_page(current, 400, "The current password is wrong.")
        # Hashed as the check was: on the limiter, outside the transaction.
        hashed = await trio.to_thread.run_sync(passwords.hash_password, new, limiter=pages.hashing)
        await state.db.transaction(
            lambda conn: ui_accounts.set_password_hash(
                conn, username, hashed, current.actor, "ui.password.changed", keep_session=token
            )
        )
        return pages.done("/account", "account.password_changed")
