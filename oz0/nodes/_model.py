"""A node as operators see it, and whether it is connected now."""

from __future__ import annotations

import datetime as dt
import hashlib
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import listing
from oz0.json_values import iso
from oz0.membership import UP_WINDOW
from oz0.nodes._rules import NodeNotFound

HEARTBEAT = 5.0
# "A node silent for three heartbeats is shown disconnected."
SILENT_AFTER = dt.timedelta(seconds=3 * HEARTBEAT)


def public_key_sha256(key: ec.EllipticCurvePublicKey) -> str:
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


class NodeJson(TypedDict):
    """A node as the API answers it."""

    id: str
    state: str
    tenant: str
    labels: dict[str, str]
    hostname: str
    connected: bool
    server: str | None
    last_seen: str | None
    joined_at: str
    token_id: str | None
    reason: str | None


@dataclass(frozen=True)
class Node:
    id: str
    state: str
    tenant: str
    labels: dict[str, str]
    hostname: str
    token_id: str | None
    reason: str | None
    server: str | None
    last_seen: dt.datetime | None
    joined_at: dt.datetime
    connected: bool
    # Accepted once (it was issued a certificate): only such a node can be purged.
    has_certificate: bool

    def to_json(self) -> NodeJson:
        return {
            "id": self.id,
            "state": self.state,
            "tenant": self.tenant,
            "labels": self.labels,
            "hostname": self.hostname,
            "connected": self.connected,
            "server": self.server if self.connected else None,
            "last_seen": iso(self.last_seen),
            "joined_at": self.joined_at.isoformat(),
            "token_id": self.token_id,
            "reason": self.reason,
        }


# Connected: heard from lately, through a server that is up (a killed server's nodes are
# not shown connected to it while their last_seen ages).
# The condition, with the parameters CONNECTED_PARAMS, is shared with job placement.
CONNECTED = (
    "(nodes.server IS NOT NULL AND nodes.last_seen > now() - %(silent)s AND EXISTS ("
    "SELECT 1 FROM servers s WHERE s.id = nodes.server AND s.last_heartbeat > now() - %(up)s"
    "))"
)
CONNECTED_PARAMS = {"silent": SILENT_AFTER, "up": UP_WINDOW}
# A Node's columns, in its order.
SELECT = (
    "SELECT id, state, tenant, labels, hostname, token_id, reason, server, last_seen,"
    f" joined_at, {CONNECTED} AS connected, certificate IS NOT NULL FROM nodes"
)


def get(
    conn: psycopg.Connection[Any],
    node_id: str,
    *,
    lock: bool = False,
    scope: listing.Scope = None,
) -> Node:
    """The node NODE_ID; NodeNotFound if there is none in SCOPE's tenants (None: any), the
    same answer for another tenant's node as for an unknown ID."""
    where = listing.Where().also("id = %(id)s", id=node_id).within("tenant", scope)
    row = conn.execute(
        SELECT + where.sql + (" FOR UPDATE OF nodes" if lock else ""),
        {**CONNECTED_PARAMS, **where.params},
    ).fetchone()
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return Node(*row)


def get_many(
    conn: psycopg.Connection[Any], node_ids: list[str], *, scope: listing.Scope = None
) -> list[Node]:
    """The nodes of NODE_IDS that exist in SCOPE's tenants (None: any), in no order."""
    where = listing.Where().also("id = ANY(%(ids)s)", ids=node_ids).within("tenant", scope)
    rows = conn.execute(SELECT + where.sql, {**CONNECTED_PARAMS, **where.params}).fetchall()
    return [Node(*r) for r in rows]


def tenants_of(conn: psycopg.Connection[Any], node_ids: list[str]) -> dict[str, str]:
    """The tenant of each node of NODE_IDS that the cluster has, or had: a deleted node's
    is named by its last audit row that names one tenant (its join, its deletion). A node
    found in neither is left out. A node's tenant never changes, so an answer holds."""
    found = {
        str(r[0]): str(r[1])
        for r in conn.execute("SELECT id, tenant FROM nodes WHERE id = ANY(%s)", (node_ids,))
    }
    gone = [f"node:{n}" for n in node_ids if n not in found]
    if gone:
        rows = conn.execute(
            "SELECT DISTINCT ON (target) substr(target, 6), tenants[1] FROM audit_log"
            " WHERE target = ANY(%s) AND cardinality(tenants) = 1 ORDER BY target, id DESC",
            (gone,),
        )
        found.update((str(r[0]), str(r[1])) for r in rows)
    return found
