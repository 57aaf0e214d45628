"""/tenants (the list, and Create tenant through the API's own code) and /servers (every
server's row, up or down by membership's heartbeat window)."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from quart import Blueprint

from oz0 import membership, nodes, tenants
from oz0.ui_sessions import Session
from oz0.web.pages import Page, Pages

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {"tenant.created": "Tenant created, with its Temporal namespace."}
)


def add(web: Blueprint, pages: Pages) -> None:
    state = pages.state

    async def tenants_page(
        current: Session, status: int = 200, error: str | None = None, name: str = ""
    ) -> Page:
        scope = current.person.scope

        def read(conn: Any) -> dict[str, Any]:
            return {
                "tenants": tenants.list_tenants(conn, scope=scope),
                "counts": tenants.node_counts(conn, scope=scope),
            }

        facts = await state.db.transaction(read)
        return await pages.render(
            "tenants.html", current, status, error=error, name=name, states=nodes.STATES, **facts
        )

    @web.get("/tenants")
    async def tenant_list() -> Page:
        return await tenants_page(await pages.session())

    @web.post("/tenants")
    async def tenant_create() -> Page:
        current, form = await pages.posted()
        name = form.get("name", "").strip()
        try:
            await tenants.create_with_namespace(state.db, state.temporal, name, current.actor)
        except tenants.TenantRefused as e:
            message = str(e)
            return await tenants_page(current, e.status, message[:1].upper() + message[1:], name)
        return pages.done("/tenants", "tenant.created")

    @web.get("/servers")
    async def server_list() -> Page:
        current = await pages.session()
        rows = await state.db.transaction(membership.all_servers)
        return await pages.render(
            "servers.html",
            current,
            servers=rows,
            up=sum(1 for s in rows if s.up),
            window=int(membership.UP_WINDOW.total_seconds()),
        )
