"""What every API module shares: the state, errors, the calling operator, request bodies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from quart import request

from oz0 import audit, nodes, operators, pki
from oz0.cluster import Cluster
from oz0.server.api.operator_cache import OperatorCache
from oz0.server.https import peer_cert_der
from oz0.server.metrics import ServerMetrics
from oz0.server.readiness import Readiness
from oz0.store.batches import Batches
from oz0.store.events import EventHub
from oz0.store.pool import Database
from oz0.temporal.role import Temporal


@dataclass(frozen=True)
class ManagementState:
    db: Database
    cluster: Cluster
    server_id: str
    temporal: Temporal
    metrics: ServerMetrics
    readiness: Readiness
    # Tells this server's job sweeper to look now (a job was created or cancelled).
    kick_jobs: Callable[[], None] = lambda: None
    # This server's notifications, for the web UI's live updates (None: no live updates).
    hub: EventHub | None = None
    # Operator certificates found current a moment ago (see operator_cache).
    operator_cache: OperatorCache = field(default_factory=OperatorCache)
    # Single-node blocks and unblocks that arrive together share a transaction (served by
    # management.run; until then each has its own).
    node_changes: Batches = field(init=False)
    # Set when the server begins to stop: what never ends by itself (a live page) ends.
    stopping: trio.Event = field(default_factory=trio.Event)

    def __post_init__(self) -> None:
        changes = Batches(self.db, (nodes.NodeError,), together=nodes.write_changes)
        object.__setattr__(self, "node_changes", changes)
        if self.hub is not None:
            self.operator_cache.attach(self.hub)


class ApiError(Exception):
    """Answered as `{"error": message}` with STATUS; the CLI prints the message."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


async def operator(state: ManagementState) -> audit.Actor:
    """The operator calling, from the client certificate; ApiError if not one we trust."""
    der = peer_cert_der(request.scope)
    if der is None:
        raise ApiError(401, "an operator client certificate is required")
    identity = pki.identity_of_der(der)
    if identity.role != pki.Role.OPERATOR or identity.cluster != state.cluster.name:
        raise ApiError(403, "this certificate does not belong to an operator of this cluster")
    if not await state.operator_cache.confirmed(
        identity, lambda: state.db.transaction(lambda conn: operators.is_current(conn, identity))
    ):
        raise _unknown(identity)
    return audit.Actor("operator", identity.name)


def _unknown(identity: pki.Identity) -> ApiError:
    return ApiError(
        403,
        f"operator {identity.name} is unknown or this certificate was replaced; "
        "get new credentials with `orchestrator-zero server operator issue`",
    )


async def json_object() -> dict[str, Any]:
    body: Any = await request.get_json(force=True, silent=True)
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    return body
