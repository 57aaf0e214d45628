"""Purging on a control stream: the signed command, the node's answer, forgetting it."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import nodes, purge_command
from oz0.server.edge import common
from oz0.server.edge.common import CLOSE_BLOCKED, Edge, refuse, send
from oz0.server.edge.wire import Wire

log = logging.getLogger(__name__)

PURGE_ANSWER_TIMEOUT = 30.0


PURGE_ANSWERS = ("purged", "purge_refused")


def decode(raw: str | bytes) -> dict[str, Any]:
    """A message on a control stream; anything not a JSON object reads as {} (ignored)."""
    try:
        return common.decode(raw)
    except ValueError:
        return {}


async def record_refusal(edge: Edge, node_id: str, answer: dict[str, Any], nonce: str) -> None:
    """The node refused the command this edge sent it (NONCE): the node's word, audited.

    Only such answers are: anything else a node sends is not worth a row (a node could
    send refusals in a loop).
    """
    reason = answer.get("reason")
    reason = reason if isinstance(reason, str) else "no reason given"
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


async def next_answer(edge: Edge, ws: Wire, node_id: str) -> dict[str, Any]:
    """The node's next answer to a purge command, read on a stream not welcomed."""
    while True:
        message = decode(await ws.get_message())
        if message.get("type") in PURGE_ANSWERS:
            return message


async def purge(
    edge: Edge,
    ws: Wire,
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
            if answer.get("nonce") != command.nonce:
                # Not an answer to this command: nothing to act on or record.
                log.debug("node %s answered a purge command it was not sent", node_id)
                continue
            if answer.get("type") == "purge_refused":
                await record_refusal(edge, node_id, answer, command.nonce)
                await refuse(ws, node_id, "purging")
                await common.close(ws, CLOSE_BLOCKED, "purging")
                return
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
    await common.close(ws)
