"""What every part of the edge shares: its state and how messages are sent and read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import trio
from trio_websocket import WebSocketConnection

from oz0 import audit
from oz0.cluster import Cluster
from oz0.server.edge.directory import EdgeDirectory
from oz0.server.edge.tracking import SeenTracker, StreamReconciler
from oz0.server.events import EventHub
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Conn, Database

log = logging.getLogger(__name__)
T = TypeVar("T")

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
    # Shared by every connection's reads, so an outage is one log line, not one per node.
    outage: Outage = field(default_factory=lambda: Outage("the edge's database reads", log))

    @property
    def actor(self) -> audit.Actor:
        return audit.Actor("server", self.server_id)

    async def transaction(self, work: Callable[[Conn], T]) -> T:
        """WORK in one transaction; DatabaseUnavailable (the node is told to come back
        later) if the database cannot be reached."""
        try:
            result = await self.db.transaction(work)
        except DATABASE_ERRORS as e:
            self.outage.failed(e)
            raise DatabaseUnavailable from None
        self.outage.worked()
        return result


class DatabaseUnavailable(Exception):
    """The database is unreachable: the edge answers `unavailable` and closes."""

    code = "unavailable"
    message = "the cluster's database is unavailable; try again shortly"


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
