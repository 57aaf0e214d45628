"""Purging on a control stream: the signed command, the node's answer, forgetting it."""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ec
from trio_websocket import WebSocketConnection

from oz0 import nodes, purge_command
from oz0.server.edge.common import CLOSE_BLOCKED, Edge, refuse, send

log = logging.getLogger(__name__)

PURGE_ANSWER_TIMEOUT = 30.0


PURGE_ANSWERS = ("purged", "purge_refused")


def decode(raw: str | bytes) -> dict[str, Any]:
    try:
        message = json.loads(raw)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


async def record_answer(edge: Edge, node_id: str, message: dict[str, Any]) -> None:
    """A refused purge command is recorded whoever sent it: it may not have been us."""
    if message.get("type") != "purge_refused":
        return
    reason, nonce = message.get("reason"), message.get("nonce")
    reason = reason if isinstance(reason, str) else "no reason given"
    nonce = nonce if isinstance(nonce, str) else None
    log.warning("node %s refused a purge command: %r", node_id, reason[: nodes.MAX_REASON])
    await edge.db.transaction(
        partial(
            nodes.purge_refused,
            node_id=node_id,
            reason=reason,
            nonce=nonce,
            server_id=edge.server_id,
        )
    )


async def next_answer(edge: Edge, ws: WebSocketConnection, node_id: str) -> dict[str, Any]:
    """The node's next answer to a purge command, read on a stream not welcomed."""
    while True:
        message = decode(await ws.get_message())
        if message.get("type") in PURGE_ANSWERS:
            await record_answer(edge, node_id, message)
            return message


async def purge(
    edge: Edge,
    ws: WebSocketConnection,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    challenge: bytes,
    next_answer: Callable[[], Awaitable[dict[str, Any]]],
) -> None:
    """Send the signed purge command; forget the node once it answers that it goes."""
    command = purge_command.sign(
        edge.cluster.cluster_ca, cluster=edge.cluster.name, node_id=node_id, challenge=challenge
    )
    await send(ws, "purge", command=command.command, signature=command.signature)
    with trio.move_on_after(PURGE_ANSWER_TIMEOUT) as waiting:
        while True:
            answer = await next_answer()
            if answer.get("type") == "purge_refused":
                await refuse(ws, node_id, "purging")
                await ws.aclose(CLOSE_BLOCKED, "purging")
                return
            if answer.get("nonce") == command.nonce:
                break
    if waiting.cancelled_caught:
        log.warning("node %s did not answer its purge command; it stays purging", node_id)
        return
    forgotten = await edge.db.transaction(
        partial(
            nodes.purged, node_id=node_id, key=key, nonce=command.nonce, server_id=edge.server_id
        )
    )
    log.info("node %s purged%s", node_id, "" if forgotten else " (it was deleted meanwhile)")
    await send(ws, "forgotten", node_id=node_id)
    await ws.aclose()
