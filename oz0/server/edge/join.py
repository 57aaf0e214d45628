"""`/join`: a node asks to join, or waits for an operator and picks its certificate up."""

from __future__ import annotations

import logging
from functools import partial
from typing import Any

import psycopg
import psycopg.errors
import trio

from oz0 import audit, joins, node_strings, nodes, tokens
from oz0.server.edge.common import DatabaseUnavailable, Edge, receive_first, send
from oz0.server.edge.wire import Wire

log = logging.getLogger(__name__)

PICKUP_HOLD = 30.0


async def serve_join(edge: Edge, ws: Wire, challenge: bytes) -> None:
    try:
        message = await receive_first(ws)
    except ValueError as e:
        await send(ws, "error", code="bad_request", message=str(e))
        return
    if message.get("type") == "join":
        await _answer_join(edge, ws, message)
    elif message.get("type") == "pickup":
        await _answer_pickup(edge, ws, message, challenge)
    else:
        await send(ws, "error", code="bad_request", message="expected a join or pickup message")


async def _answer_join(edge: Edge, ws: Wire, message: dict[str, Any]) -> None:
    csr, token = message.get("csr"), message.get("token")
    if not isinstance(csr, str) or not (token is None or isinstance(token, str)):
        edge.metrics.join_refused("bad_request")
        await send(ws, "error", code="bad_request", message="join needs a PEM csr")
        return
    try:
        hostname, labels = node_strings.check_join(message)
    except node_strings.UntrustedString as e:
        edge.metrics.join_refused("bad_request")
        await send(ws, "error", code="bad_request", message=str(e))
        return

    def add(conn: psycopg.Connection[Any]) -> nodes.Joined:
        again = nodes.rejoin(conn, csr)
        if again is not None:
            return again
        nodes.check_room_for_pending(conn, edge.max_pending)
        return nodes.join(
            conn, edge.cluster.cluster_ca, csr_pem=csr, labels=labels, hostname=hostname
        )

    try:
        if token:
            # Written with the joins that arrive with it (join_batch), counted exactly.
            joined = await edge.joins.join(joins.TokenJoin(csr, token, labels, hostname))
        else:
            try:
                joined = await edge.transaction(add)
            except psycopg.errors.UniqueViolation:
                # The same key joined through another connection and committed first (the
                # unique index made this one wait for it): this join is that node.
                joined = await edge.transaction(add)
    except DatabaseUnavailable:
        edge.metrics.join_refused("unavailable")
        raise
    except tokens.TokenRefused as e:
        edge.metrics.join_refused(e.reason)
        await edge.join_refusals.refused(
            e.reason,
            partial(tokens.record_refusal, refusal=e, hostname=hostname, actor=edge.actor),
        )
        await send(ws, "error", code="token_refused", message=str(e))
        return
    except nodes.TooManyPending as e:
        edge.metrics.join_refused("pending_limit")
        details = {"reason": "pending_limit", "limit": e.limit, "hostname": hostname[:253]}
        await edge.join_refusals.refused(
            "pending_limit",
            lambda conn: audit.record(conn, edge.actor, "node.join.refused", "cluster", details),
        )
        await send(ws, "error", code="pending_limit", message=str(e))
        return
    except nodes.LabelsRefused as e:
        # Audited, as a refused token is: a node claiming labels its token locks is news.
        edge.metrics.join_refused("labels_locked")
        await edge.join_refusals.refused(
            "labels_locked", partial(_record_labels_refused, e, hostname, edge.actor)
        )
        await send(ws, "error", code="bad_request", message=str(e))
        return
    except nodes.NodeError as e:
        edge.metrics.join_refused("bad_request")
        await send(ws, "error", code="bad_request", message=str(e))
        return
    edge.metrics.joined(joined.state)
    log.info("node %s joined (%s, tenant %s)", joined.node_id, joined.state, joined.tenant)
    await send(
        ws,
        "joined",
        node_id=joined.node_id,
        state=joined.state,
        tenant=joined.tenant,
        certificate=joined.certificate,
        edges=edge.directory.edges,
    )


def _record_labels_refused(
    refusal: nodes.LabelsRefused, hostname: str, actor: audit.Actor, conn: psycopg.Connection[Any]
) -> None:
    """`node.join.refused` about the token's tenant, naming the labels claimed."""
    known = tokens.get(conn, refusal.token_id) if refusal.token_id is not None else None
    audit.record(
        conn, actor, "node.join.refused", f"token:{refusal.token_id or 'unknown'}",
        {"reason": "labels_locked", "labels": refusal.labels, "hostname": hostname[:253]},
        tenants=[known.tenant] if known is not None else [],
    )  # fmt: skip


async def _answer_pickup(edge: Edge, ws: Wire, message: dict[str, Any], challenge: bytes) -> None:
    node_id, signature = message.get("node_id"), message.get("signature")
    if (
        not isinstance(node_id, str)
        or not isinstance(signature, str)
        or not nodes.is_node_id(node_id)
    ):
        await send(ws, "error", code="bad_request", message="pickup needs node_id and signature")
        return
    with trio.move_on_after(PICKUP_HOLD):
        while True:
            with edge.hub.watch_node(node_id) as changed:
                try:
                    found = await edge.transaction(
                        lambda conn: nodes.pickup(conn, node_id, challenge, signature)
                    )
                except nodes.NodeNotFound:
                    await send(
                        ws, "error", code="unknown_node", message=f"node {node_id} not found"
                    )
                    return
                if found.state == "accepted" and found.certificate:
                    await send(
                        ws,
                        "joined",
                        node_id=node_id,
                        state="accepted",
                        tenant=found.tenant,
                        certificate=found.certificate,
                        edges=edge.directory.edges,
                    )
                    return
                if found.state == "rejected":
                    await send(ws, "rejected", reason=found.reason or "rejected by an operator")
                    return
                if found.state != "pending":
                    await send(
                        ws, "error", code=found.state, message=f"node {node_id} is {found.state}"
                    )
                    return
                await changed.wait()
    await send(ws, "pending")
