"""GET /api/v1/nodes (paged: limit, cursor; filters state, tenant, label, search),
GET /api/v1/nodes/<id>, POST /api/v1/nodes/<id>/accept, /reject, /block, /unblock,
/purge, DELETE /api/v1/nodes/<id>, and POST /api/v1/nodes/block and /unblock for many
nodes at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Required, TypedDict

import psycopg
from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import access, listing, nodes, tokens
from oz0.errors import Oz0Error
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described


class NodeQuery(TypedDict, total=False):
    limit: int
    cursor: str
    state: str
    tenant: str
    # `KEY=VALUE` labels, comma-separated.
    label: str
    search: str


class NodePage(TypedDict):
    next_cursor: str | None
    nodes: list[nodes.NodeJson]


class Nodes(TypedDict):
    nodes: list[nodes.NodeJson]


class Reason(TypedDict, total=False):
    reason: str


class Blocking(TypedDict):
    reason: str


class Selection(TypedDict, total=False):
    """Nodes by their IDs, or by labels (with a tenant, or in every tenant one reaches)."""

    ids: list[str]
    selector: dict[str, str]
    tenant: str


class BlockSelection(Selection):
    reason: Required[str]


_ONE = {
    400: "not a node ID, or a reason that is not one printable line",
    404: "no such node (or another tenant's)",
    409: "its state forbids the change",
}
NODE_ID = {"type": "string", "pattern": "^node-[0-9a-f]{12}$"}
_NODE_ID = {"node_id": NODE_ID}
_MANY = {
    404: "a node is unknown, or the selector matches none",
    409: "a node's state forbids the change",
}


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.get("/api/v1/nodes")
    @described("A page of nodes, oldest first", query=NodeQuery, answers={200: NodePage})
    async def node_list() -> Response:
        """A page of nodes, oldest first: `limit` rows at most (listing.DEFAULT_LIMIT,
        up to listing.MAX_LIMIT) after `cursor`, with the cursor of the next page."""
        person = await operator(state)
        args = request.args
        try:
            limit = listing.limit_of(args.get("limit"))
            matching = nodes.NodeFilter.of_args(
                state=args.get("state"), tenant=args.get("tenant"), label=args.get("label"),
                search=args.get("search"),
            )  # fmt: skip
            rows, next_cursor = await state.db.transaction(
                lambda conn: nodes.list_page_json(
                    conn, matching, limit=limit, after=args.get("cursor"), scope=person.scope
                )
            )
        except (nodes.NodeError, listing.BadPaging) as e:
            raise ApiError(400, str(e)) from None
        # The nodes come as JSON text already (see nodes.list_page_json).
        body = '{"next_cursor":' + json.dumps(next_cursor) + ',"nodes":[' + ",".join(rows) + "]}"
        return Response(body, content_type="application/json")

    @app.get("/api/v1/nodes/<node_id>")
    @described(
        "A node", answers={200: nodes.NodeJson},
        path=_NODE_ID, errors=_ONE,
    )  # fmt: skip
    async def node_show(node_id: str) -> Response:
        scope = (await operator(state)).scope
        return await _change(
            state, lambda conn: nodes.get(conn, nodes.check_node_id(node_id), scope=scope)
        )

    @app.post("/api/v1/nodes/<node_id>/accept")
    @described(
        "Accept a node that asked to join",
        answers={200: nodes.NodeJson},
        path=_NODE_ID,
        errors=_ONE,
    )
    async def node_accept(node_id: str) -> Response:
        actor = await operator(state)
        ca = state.cluster.cluster_ca
        return await _change(
            state, lambda conn: nodes.accept(conn, ca, node_id, actor, scope=actor.scope)
        )

    @app.post("/api/v1/nodes/<node_id>/reject")
    @described(
        "Reject a node that asked to join",
        body=Reason,
        answers={200: nodes.NodeJson},
        path=_NODE_ID,
        errors=_ONE,
    )
    async def node_reject(node_id: str) -> Response:
        actor = await operator(state)
        reason = (await json_object()).get("reason")
        if reason is not None and not isinstance(reason, str):
            raise ApiError(400, "reason must be text")
        return await _change(
            state, lambda conn: nodes.reject(conn, node_id, actor, reason, scope=actor.scope)
        )

    @app.post("/api/v1/nodes/block")
    @described("Block many nodes at once", body=BlockSelection, answers={200: Nodes}, errors=_MANY)
    async def nodes_block() -> Response:
        actor = await operator(state)
        body = await json_object()
        reason = body.get("reason")
        if not isinstance(reason, str):
            raise ApiError(400, "a reason is required: say why, it goes to the audit log")
        selection = _selection(body, actor, "block nodes")
        return await _change_many(
            state, lambda conn: nodes.block_many(conn, selection, actor, reason, scope=actor.scope)
        )

    @app.post("/api/v1/nodes/unblock")
    @described("Unblock many nodes at once", body=Selection, answers={200: Nodes}, errors=_MANY)
    async def nodes_unblock() -> Response:
        actor = await operator(state)
        selection = _selection(await json_object(), actor, "unblock nodes")
        return await _change_many(
            state, lambda conn: nodes.unblock_many(conn, selection, actor, scope=actor.scope)
        )

    @app.post("/api/v1/nodes/<node_id>/block")
    @described(
        "Block a node", body=Blocking, answers={200: nodes.NodeJson},
        path=_NODE_ID, errors=_ONE,
    )  # fmt: skip
    async def node_block(node_id: str) -> Response:
        actor = await operator(state)
        reason = (await json_object()).get("reason")
        if not isinstance(reason, str):
            raise ApiError(400, "a reason is required: say why, it goes to the audit log")
        change = nodes.NodeChange("block", node_id, actor, reason, scope=actor.scope)
        return await _change(state, change, batched=True)

    @app.post("/api/v1/nodes/<node_id>/unblock")
    @described(
        "Unblock a node", answers={200: nodes.NodeJson},
        path=_NODE_ID, errors=_ONE,
    )  # fmt: skip
    async def node_unblock(node_id: str) -> Response:
        actor = await operator(state)
        change = nodes.NodeChange("unblock", node_id, actor, scope=actor.scope)
        return await _change(state, change, batched=True)

    @app.post("/api/v1/nodes/<node_id>/purge")
    @described(
        "Purge a node: its agent removes itself",
        answers={200: nodes.NodeJson},
        path=_NODE_ID,
        errors=_ONE,
    )
    async def node_purge(node_id: str) -> Response:
        actor = await operator(state)
        return await _change(
            state, lambda conn: nodes.purge(conn, node_id, actor, scope=actor.scope)
        )

    @app.delete("/api/v1/nodes/<node_id>")
    @described(
        "Delete a node's record", answers={200: nodes.NodeJson},
        path=_NODE_ID, errors=_ONE,
    )  # fmt: skip
    async def node_delete(node_id: str) -> Response:
        actor = await operator(state)
        return await _change(
            state, lambda conn: nodes.delete(conn, node_id, actor, scope=actor.scope)
        )


async def _change(
    state: ManagementState,
    change: Callable[[psycopg.Connection[Any]], nodes.Node],
    *,
    batched: bool = False,
) -> Response:
    """One node read or changed in one transaction: 404 if unknown, 409 if its state forbids
    the change. BATCHED: the transaction may be shared with other such changes
    (`state.node_changes`, which writes them with nodes.write_changes); CHANGE must then be
    a nodes.NodeChange."""
    try:
        if batched:
            node = await state.node_changes.run(change)
        else:
            node = await state.db.transaction(change)
    except nodes.NodeNotFound as e:
        raise ApiError(404, str(e)) from None
    except nodes.BadNodeInput as e:
        raise ApiError(400, str(e)) from None
    except nodes.NodeError as e:
        raise ApiError(409, str(e)) from None
    return jsonify(node.to_json())


def _selection(body: dict[str, Any], person: access.Person, doing: str) -> nodes.Selection:
    """`{"ids": [ID, ...]}` or `{"selector": {KEY: VALUE, ...}, "tenant": T}` (tenant
    optional; one PERSON does not reach is refused, 403: it names that tenant outright)."""
    ids, selector, tenant = body.get("ids"), body.get("selector"), body.get("tenant")
    if (ids is None) == (selector is None):
        raise ApiError(400, "give either ids (a list of node IDs) or selector (labels), not both")
    try:
        if ids is not None:
            if tenant is not None:
                raise ApiError(400, "tenant goes with a selector, not with ids")
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise ApiError(400, "ids must be a list of node IDs")
            return nodes.select_ids(ids)
        if not isinstance(selector, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in selector.items()
        ):
            raise ApiError(400, "selector must be an object of KEY: VALUE labels")
        if tenant is not None and not isinstance(tenant, str):
            raise ApiError(400, "tenant must be text")
        if tenant is not None:
            person.check(access.Right.OPERATE, doing, tenant=tenant)
        return nodes.select_labels(tokens.check_labels(dict(selector)), tenant)
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None
    except (nodes.NodeError, Oz0Error) as e:
        raise ApiError(400, str(e)) from None


async def _change_many(
    state: ManagementState, change: Callable[[psycopg.Connection[Any]], list[nodes.Node]]
) -> Response:
    """Many nodes changed in one transaction, or none: 404 if one is unknown or a selector
    matches none, 409 if one's state forbids the change, 400 if there are too many."""
    try:
        changed = await state.db.transaction(change)
    except nodes.NodeNotFound as e:
        raise ApiError(404, str(e)) from None
    except (nodes.TooManyNodes, nodes.BadNodeInput) as e:
        raise ApiError(400, str(e)) from None
    except nodes.NodeError as e:
        raise ApiError(409, str(e)) from None
    return jsonify({"nodes": [n.to_json() for n in changed]})
