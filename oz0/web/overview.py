"""/overview: nodes by state and tenant, the servers up, the latest audit entries."""

from __future__ import annotations

from collections import Counter
from typing import Any

from quart import Blueprint

from oz0 import audit, nodes
from oz0.server import membership
from oz0.web.pages import Page, Pages


def add(web: Blueprint, pages: Pages) -> None:
    @web.get("/overview")
    async def overview() -> Page:
        current = await pages.session()

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

        return await pages.render(
            "overview.html", current, **await pages.state.db.transaction(read)
        )
