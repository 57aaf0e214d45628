"""What every part of the edge shares: its state and how messages are sent and read."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import trio
from trio_websocket import WebSocketConnection

from oz0 import audit
from oz0.cluster import Cluster
from oz0.server.edge.directory import EdgeDirectory
from oz0.server.edge.tracking import SeenTracker, StreamReconciler
from oz0.server.events import EventHub
from oz0.store.pool import Database

FIRST_MESSAGE_TIMEOUT = 30.0
CLOSE_BLOCKED = 4403


@dataclass
class Edge:
    db: Database
    cluster: Cluster
    server_id: str
    hub: EventHub
    directory: EdgeDirectory
    seen: SeenTracker
    streams: StreamReconciler
    # This server's Temporal frontend, as nodes reach it (for their runtime); None when
    # the edge runs without an advertise address.
    temporal: str | None = None

    @property
    def actor(self) -> audit.Actor:
        return audit.Actor("server", self.server_id)


async def send(ws: WebSocketConnection, kind: str, **fields: Any) -> None:
    await ws.send_message(json.dumps({"type": kind, **fields}))


async def receive_first(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(FIRST_MESSAGE_TIMEOUT):
        raw = await ws.get_message()
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise ValueError("messages must be JSON objects")
    return message


async def refuse(ws: WebSocketConnection, node_id: str, state: str | None) -> None:
    code = state or "unknown"
    await send(ws, "refused", code=code, message=f"node {node_id} is {code}")
