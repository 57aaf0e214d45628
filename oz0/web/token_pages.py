"""/tokens: the join tokens, creating one (its secret and join command shown once), and
revoking one (a confirm page first; tokens.js makes it a dialog).

A token is made and revoked by the same oz0.tokens functions the JSON API calls, from a
TokenSpec checked by the same TokenSpec.from_json, with the actor `ui:<account>`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from quart import Blueprint
from werkzeug.datastructures import MultiDict

from oz0 import access, listing, tenant_caps, tenants, tokens
from oz0.cap_rules import CapReached
from oz0.errors import Oz0Error
from oz0.server import join_command
from oz0.ui_sessions import Session
from oz0.web import paging
from oz0.web.form_fields import form_lines, whole_number
from oz0.web.pages import Page, Pages, Refused

# What the list and the confirm page call a token's state.
STATE_NAMES: dict[tokens.TokenState, str] = {
    "live": "live",
    "expired": "expired",
    "used_up": "used up",
    "revoked": "revoked",
}

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {"token.revoked": "Token revoked. Nodes that joined with it stay."}
)


def spec_from_form(form: MultiDict[str, str]) -> tokens.TokenSpec:
    """The create form as the API's JSON body, checked by the same TokenSpec.from_json."""
    return tokens.TokenSpec.from_json(
        {
            "tenant": form.get("tenant", ""),
            "ttl": form.get("ttl", ""),
            "max_uses": whole_number(form.get("max_uses", "")),
            "labels": tokens.parse_label_pairs(form_lines(form.get("labels", ""))),
            "description": form.get("description", "").strip(),
            "lock_labels": form.get("lock_labels") == "on",
        }
    )


def add(web: Blueprint, pages: Pages) -> None:
    db = pages.state.db

    def listed(conn: Any, scope: listing.Scope) -> dict[str, Any]:
        now: dt.datetime = conn.execute("SELECT now()").fetchone()[0]
        newest_first = list(reversed(tokens.list_tokens(conn, scope=scope)))
        return {"rows": [(t, STATE_NAMES[t.state(now)]) for t in newest_first]}

    async def token_list(session: Session, status: int = 200, error: str | None = None) -> Page:
        found = await db.transaction(lambda conn: listed(conn, session.person.scope))
        rows = found["rows"]
        page = paging.page_number()
        newer, older = paging.links(pages, page, page * paging.ROWS < len(rows))
        return await pages.render(
            "tokens.html", session, status, error=error, total=len(rows), newer=newer,
            older=older, rows=rows[(page - 1) * paging.ROWS : page * paging.ROWS],
        )  # fmt: skip

    async def create_form(
        session: Session, form: MultiDict[str, str], status: int = 200, error: str | None = None
    ) -> Page:
        scope = session.person.scope
        names = await db.transaction(
            lambda conn: [t.name for t in tenants.list_tenants(conn, scope=scope)]
        )
        return await pages.render(
            "token_new.html", session, status, tenants=names, form=form, error=error,
            default_ttl=tokens.DEFAULT_TTL, default_max_uses=tokens.DEFAULT_MAX_USES,
        )  # fmt: skip

    @web.get("/tokens")
    async def tokens_page() -> Page:
        return await token_list(await pages.session())

    @web.get("/tokens/new")
    async def new_token() -> Page:
        return await create_form(await pages.session(), MultiDict())

    @web.post("/tokens")
    async def create_token() -> Page:
        session, form = await pages.posted()
        try:
            spec = spec_from_form(form)
            session.person.check(access.Right.OPERATE, "create join tokens", tenant=spec.tenant)
        except access.Forbidden as e:
            raise Refused(str(e)) from None
        except Oz0Error as e:
            return await create_form(session, form, 400, str(e))
        try:
            tokens.check_creator(session.person, spec)
            where = await join_command.offer(db, pages.state.server_id)

            def create(conn: Any) -> tuple[tokens.JoinToken, str]:
                tenant_caps.room_for_token(conn, spec.tenant)
                return tokens.create_from(conn, spec, session.actor)

            token, secret = await db.transaction(create)
        except access.Forbidden as e:
            # On the form, which a ttl and a number of uses make good.
            return await create_form(session, form, 403, str(e))
        except CapReached as e:
            return await create_form(session, form, e.status, str(e))
        except Oz0Error as e:
            return await create_form(session, form, 400, str(e))
        join = where.command(secret, pages.state.cluster.ca_hash)
        # Shown in this answer only: the cluster keeps the secret's hash, no page has it again.
        return await pages.render(
            "token_created.html", session, token=token, secret=secret, join=join,
        )  # fmt: skip

    @web.get("/tokens/<token_id>/revoke")
    async def confirm_revoke(token_id: str) -> Page:
        session = await pages.session()
        scope = session.person.scope
        token = await db.transaction(lambda conn: tokens.get(conn, token_id, scope=scope))
        if token is None:
            return await pages.missing(session, f"token {token_id}")
        if token.revoked:
            return await token_list(session, 409, f"token {token_id} is already revoked")
        return await pages.render("token_revoke.html", session, token=token)

    @web.post("/tokens/<token_id>/revoke")
    async def revoke_token(token_id: str) -> Page:
        session, _ = await pages.posted()
        try:
            await db.transaction(
                lambda conn: tokens.revoke(
                    conn, token_id, session.actor, scope=session.person.scope
                )
            )
        except tokens.TokenNotFound:
            return await pages.missing(session, f"token {token_id}")
        except tokens.TokenAlreadyRevoked as e:
            return await token_list(session, 409, str(e))
        return pages.done("/tokens", "token.revoked")
