"""/overview: nodes by tenant and state (each count a link to that list), the servers up
with their Temporal state, the latest audit entries."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import psycopg
from quart import Blueprint

from oz0 import audit, listing, membership, nodes
from oz0.web.pages import Page, Pages

RECENT = 12


@dataclass
class TenantCounts:
    name: str
    by_state: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    connected: int = 0

    @property
    def total(self) -> int:
        return sum(self.by_state.values())


def fleet_counts(conn: psycopg.Connection[Any], scope: listing.Scope = None) -> list[TenantCounts]:
    """Every tenant of SCOPE (None: all; those without nodes too), its nodes counted by
    state, and connected."""
    where = listing.Where().within("t.name", scope)
    rows = conn.execute(
        "SELECT t.name, nodes.state, count(nodes.id),"
        f" count(nodes.id) FILTER (WHERE {nodes.CONNECTED})"
        " FROM tenants t LEFT JOIN nodes ON nodes.tenant = t.name" + where.sql
        + " GROUP BY t.name, nodes.state ORDER BY t.name",
        {**nodes.CONNECTED_PARAMS, **where.params},
    ).fetchall()  # fmt: skip
    tenants: dict[str, TenantCounts] = {}
    for tenant, state, count, connected in rows:
        counts = tenants.setdefault(tenant, TenantCounts(tenant))
        if state is not None:
            counts.by_state[state] += count
            counts.connected += connected
    return list(tenants.values())


def add(web: Blueprint, pages: Pages) -> None:
    @web.get("/overview")
    async def overview() -> Page:
        current = await pages.session()
        # The counts, the tenants and the latest entries are the person's tenants' only.
        scope = current.person.scope

        def read(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            tenants = fleet_counts(conn, scope)
            totals = TenantCounts("all")
            for t in tenants:
                for state, count in t.by_state.items():
                    totals.by_state[state] += count
                totals.connected += t.connected
            return {
                "tenants": tenants,
                "totals": totals,
                "states": nodes.STATES,
                "servers": membership.servers_up(conn),
                "recent": audit.entries(conn, limit=RECENT, scope=scope),
            }

        facts = await pages.state.db.transaction(read)
        return await pages.render("overview.html", current, **facts)
