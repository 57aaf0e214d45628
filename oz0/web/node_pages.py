"""/nodes (the fleet, filtered and paged in the URL), /nodes/<id> (one node: its fields,
its audit history, its jobs and the actions its state allows), the actions' posts, and
the pages that ask first when there is no JavaScript (/nodes/<id>/delete, .../purge).

Each action calls the function of oz0.nodes the JSON API calls, with the session's actor;
which actions a node offers is `nodes.actions`, the rule those functions check.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any, Final
from urllib.parse import urlencode

import psycopg
from quart import Blueprint, redirect, request
from werkzeug.datastructures import MultiDict

from oz0 import access, audit, membership, nodes, tenants
from oz0 import ui_sessions as sessions
from oz0.jobs import store as jobs
from oz0.web import paging
from oz0.web.pages import Page, Pages, text_arg
from oz0_common.addresses import EDGE_PORT, host_port

# The newest audit entries and job attempts a node's page shows.
HISTORY = 50
# The fleet page counts the matching nodes up to this many, then says "10,000+": a count
# reads every row it counts, and a page of a large fleet must stay cheap.
COUNT_UP_TO = 10_000

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "node.accepted": "Node accepted: its agent picks up its certificate and starts work.",
        "node.rejected": "Node rejected: the agent stops, saying so.",
        "node.blocked": "Node blocked: its control stream ends on every server within two seconds.",
        "node.unblocked": "Node unblocked: its agent is let in again within seconds.",
        "node.deleted": "Node deleted. Its audit history stays in the audit log.",
        "node.purging": (
            "Purge ordered: on its next control stream the node deletes its data directory and"
            " its binary, then the cluster forgets it."
        ),
    }
)

_DONE = {
    "accept": "node.accepted",
    "reject": "node.rejected",
    "block": "node.blocked",
    "unblock": "node.unblocked",
    "delete": "node.deleted",
    "purge": "node.purging",
}
# A change gets the person making it: its actor for the audit row, its scope for the node.
Change = Callable[[psycopg.Connection[Any], access.Person, MultiDict[str, str]], object]


def add(web: Blueprint, pages: Pages) -> None:
    db = pages.state.db
    ca = pages.state.cluster.cluster_ca

    @web.get("/nodes")
    async def node_list() -> Page:
        current = await pages.session()
        args = request.args
        # A filter form sends its blank fields too: the page's address keeps only the rest.
        given = dict(args.items())
        kept = {k: v.strip() for k, v in given.items() if v.strip()}
        if kept != given:
            return redirect(f"/nodes?{urlencode(kept)}" if kept else "/nodes", 303)
        state, tenant = text_arg(args, "state"), text_arg(args, "tenant")
        label, search = text_arg(args, "label"), text_arg(args, "q")
        number = paging.page_number()
        filtered = any((state, tenant, label, search))
        scope = current.person.scope

        def read(conn: psycopg.Connection[Any]) -> dict[str, Any]:
            facts: dict[str, Any] = {
                "tenant_names": [t.name for t in tenants.list_tenants(conn, scope=scope)],
                "edges": [host_port(s.advertise, EDGE_PORT) for s in membership.servers_up(conn)],
                "fleet": [],
                "total": 0,
                "error": None,
            }
            try:
                matching = nodes.NodeFilter.of_args(
                    state=state, tenant=tenant, label=label, search=search
                )
                counted = nodes.count_nodes(conn, matching, most=COUNT_UP_TO + 1, scope=scope)
                facts["total"] = f"{COUNT_UP_TO:,}+" if counted > COUNT_UP_TO else counted
                facts["fleet"] = nodes.list_nodes(
                    conn, matching, limit=paging.ROWS + 1, offset=(number - 1) * paging.ROWS,
                    scope=scope,
                )  # fmt: skip
            except nodes.NodeError as e:
                facts["error"] = str(e)
            return facts

        facts = await db.transaction(read)
        first = (number - 1) * paging.ROWS + 1
        more = len(facts["fleet"]) > paging.ROWS
        facts["fleet"] = facts["fleet"][: paging.ROWS]
        shown = len(facts["fleet"])
        newer, older = paging.links(pages, number, more)
        return await pages.render(
            "nodes.html",
            current,
            400 if facts["error"] else 200,
            **facts,
            states=nodes.STATES,
            wanted={"state": state, "tenant": tenant, "label": label, "q": search},
            filtered=filtered,
            first=first,
            last=first + shown - 1,
            newer=newer,
            older=older,
            first_page=pages.query(page=None),
        )

    async def node_page(
        current: sessions.Session,
        node_id: str,
        status: int = 200,
        error: str | None = None,
        failed: tuple[str, MultiDict[str, str]] | None = None,
    ) -> Page:
        """The node's page; FAILED: the action refused and its form, to fill in again."""
        scope = current.person.scope

        def read(conn: psycopg.Connection[Any]) -> dict[str, Any] | None:
            try:
                node = nodes.get(conn, node_id, scope=scope)
            except nodes.NodeNotFound:
                return None
            return {
                "node": node,
                "actions": nodes.actions(node),
                "history": audit.entries(
                    conn, target=f"node:{node_id}", limit=HISTORY, scope=scope
                ),
                "attempts": jobs.attempts_on_node(conn, node_id, limit=HISTORY),
            }

        facts = await db.transaction(read) if nodes.is_node_id(node_id) else None
        if facts is None:
            return await pages.missing(current, f"node {node_id}")
        action, form = failed or (None, MultiDict())
        return await pages.render(
            "node.html", current, status, **facts, error=error, history_limit=HISTORY,
            failed=action, form=form,
        )  # fmt: skip

    @web.get("/nodes/<node_id>")
    async def node_show(node_id: str) -> Page:
        return await node_page(await pages.session(), node_id)

    async def confirm_page(
        current: sessions.Session, node_id: str, action: str, status: int = 200,
        error: str | None = None,
    ) -> Page:  # fmt: skip
        def read(conn: psycopg.Connection[Any]) -> nodes.Node | None:
            try:
                return nodes.get(conn, node_id, scope=current.person.scope)
            except nodes.NodeNotFound:
                return None

        node = await db.transaction(read) if nodes.is_node_id(node_id) else None
        if node is None:
            return await pages.missing(current, f"node {node_id}")
        return await pages.render(
            "node_confirm.html", current, status, node=node, action=action,
            allowed=action in nodes.actions(node), error=error,
        )  # fmt: skip

    async def act(
        node_id: str, action: str, change: Change, back: str | None = None,
        posted: tuple[sessions.Session, MultiDict[str, str]] | None = None,
    ) -> Page:  # fmt: skip
        """Take ACTION on NODE_ID: back to BACK (the node's page) with its notice, or the
        node's page again with the refusal, nothing changed."""
        current, form = posted or await pages.posted()
        if not nodes.is_node_id(node_id):
            return await pages.missing(current, f"node {node_id}")
        try:
            await db.transaction(lambda conn: change(conn, current.person, form))
        except nodes.NodeNotFound:
            return await pages.missing(current, f"node {node_id}")
        except nodes.NodeError as e:
            return await node_page(current, node_id, 409, str(e), (action, form))
        return pages.done(back or f"/nodes/{node_id}", _DONE[action])

    @web.post("/nodes/<node_id>/accept")
    async def node_accept(node_id: str) -> Page:
        return await act(
            node_id,
            "accept",
            lambda conn, who, _: nodes.accept(conn, ca, node_id, who, scope=who.scope),
        )

    @web.post("/nodes/<node_id>/reject")
    async def node_reject(node_id: str) -> Page:
        return await act(
            node_id,
            "reject",
            lambda conn, who, form: nodes.reject(
                conn, node_id, who, form.get("reason"), scope=who.scope
            ),
        )

    @web.post("/nodes/<node_id>/block")
    async def node_block(node_id: str) -> Page:
        return await act(
            node_id,
            "block",
            lambda conn, who, form: nodes.block(
                conn, node_id, who, form.get("reason", ""), scope=who.scope
            ),
        )

    @web.post("/nodes/<node_id>/unblock")
    async def node_unblock(node_id: str) -> Page:
        return await act(
            node_id,
            "unblock",
            lambda conn, who, _: nodes.unblock(conn, node_id, who, scope=who.scope),
        )

    @web.get("/nodes/<node_id>/delete")
    async def node_delete_confirm(node_id: str) -> Page:
        return await confirm_page(await pages.session(), node_id, "delete")

    @web.post("/nodes/<node_id>/delete")
    async def node_delete(node_id: str) -> Page:
        return await act(
            node_id, "delete",
            lambda conn, who, _: nodes.delete(conn, node_id, who, scope=who.scope),
            back="/nodes",
        )  # fmt: skip

    @web.get("/nodes/<node_id>/purge")
    async def node_purge_confirm(node_id: str) -> Page:
        return await confirm_page(await pages.session(), node_id, "purge")

    @web.post("/nodes/<node_id>/purge")
    async def node_purge(node_id: str) -> Page:
        # Checked here, not only by the page's script: a purge cannot be undone, so it
        # needs the node's ID typed, exactly, whatever sent the form.
        current, form = await pages.posted()
        typed = form.get("confirm", "")
        if typed != node_id:
            why = (
                f"Nothing was purged: what you typed is not this node's ID, {node_id}."
                if typed
                else f"Nothing was purged: type the node's ID, {node_id}, to confirm."
            )
            return await confirm_page(current, node_id, "purge", 400, why)
        return await act(
            node_id, "purge",
            lambda conn, who, _: nodes.purge(conn, node_id, who, scope=who.scope),
            posted=(current, form),
        )  # fmt: skip
