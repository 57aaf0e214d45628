"""What the agent does with each message the edge sends on a live control stream.

One handler per message type in HANDLERS. Commands the edge will send later (block, purge)
plug in here: a handler gets the live stream (to answer through `stream.conn`), the node
(to record a new state) and the pinned CA (to verify a signed command). A handler that
ends the stream raises: `EdgeUnavailable` to reconnect, `AgentError` to stop the agent.
Unknown types are logged and ignored, so an older agent survives a newer edge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from oz0_node.errors import AgentError, EdgeUnavailable
from oz0_node.messages import Message, Refusal, edge_list, kind
from oz0_node.node import Node
from oz0_node.transport import EdgeConnection

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LiveStream:
    node: Node
    conn: EdgeConnection
    ca_pem: bytes


Handler = Callable[[LiveStream, Message], Awaitable[None]]


class NodeRefused(EdgeUnavailable):
    """The edge refused this node for now (blocked, pending): try again later."""


def take_refusal(node: Node, refusal: Refusal, address: str) -> Exception:
    """What a `refused` means for the agent: an error to raise, after recording the state."""
    if refusal.code in ("blocked", "pending"):
        node.remember(state=refusal.code)
        return NodeRefused(f"edge {address} refused node {node.name}: {refusal.message}")
    if refusal.code == "rejected":
        node.remember(state="rejected")
        return AgentError(f"node {node.name} was rejected: {refusal.message}")
    if refusal.code == "unknown":
        return AgentError(
            f"the cluster does not know node {node.name} ({refusal.message}); "
            f"to join again, start with a new --data-dir"
        )
    return EdgeUnavailable(
        f"edge {address} refused the control stream with unknown code "
        f"{refusal.code!r}: {refusal.message}"
    )


async def _on_heartbeat(stream: LiveStream, message: Message) -> None:
    """Nothing to do: receiving anything already proved the stream alive."""


async def _on_edges(stream: LiveStream, message: Message) -> None:
    stream.node.remember(edges=edge_list(message, stream.conn.address))


async def _on_refused(stream: LiveStream, message: Message) -> None:
    address = stream.conn.address
    raise take_refusal(stream.node, Refusal.parse(message, address), address)


HANDLERS: dict[str, Handler] = {
    "heartbeat": _on_heartbeat,
    "edges": _on_edges,
    "refused": _on_refused,
}


async def dispatch(stream: LiveStream, message: Message) -> None:
    handler = HANDLERS.get(kind(message))
    if handler is None:
        log.warning(
            "ignoring a %r message from edge %s: this agent does not know it",
            kind(message),
            stream.conn.address,
        )
        return
    await handler(stream, message)
