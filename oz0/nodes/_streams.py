"""What the edges record of the nodes' control streams: connected where and when, and the
node a stream's certificate names, read when it comes up and when news of it arrives."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.hazmat.primitives.asymmetric import ec

from oz0.nodes._model import public_key_sha256


@dataclass(frozen=True)
class ControlState:
    """What a control stream needs to know of its node."""

    state: str
    tenant: str
    # Notifications of a lower revision are older than this read (oz0/store/events.py).
    revision: int


def control_state(
    conn: psycopg.Connection[Any], node_id: str, key: ec.EllipticCurvePublicKey
) -> ControlState | None:
    """The state and tenant of the node a control stream's certificate names, None if unknown.

    The key must be the one the node joined with: a certificate of a deleted node whose
    ID someone else now holds is refused.
    """
    row = conn.execute(
        "SELECT state, tenant, revision FROM nodes WHERE id = %s AND public_key_sha256 = %s",
        (node_id, public_key_sha256(key)),
    ).fetchone()
    return ControlState(str(row[0]), str(row[1]), int(row[2])) if row else None


@dataclass(frozen=True)
class ControlStateRead:
    """A control stream's re-read of its node (`control_state`); `control_states` reads many
    in one statement."""

    node_id: str
    key: ec.EllipticCurvePublicKey

    def __call__(self, conn: psycopg.Connection[Any]) -> ControlState | None:
        return control_state(conn, self.node_id, self.key)


def control_states(
    conn: psycopg.Connection[Any], reads: list[ControlStateRead]
) -> list[tuple[ControlState | None, None]]:
    """Each of READS as `control_state` would answer it, in one statement.

    A burst of blocks wakes the streams of its nodes at once: fifteen of them on one server,
    each reading its node in a transaction of its own through the pool, were refused 50-140
    ms after they woke.
    """
    rows = conn.execute(
        "SELECT id, public_key_sha256, state, tenant, revision FROM nodes WHERE id = ANY(%s)",
        (sorted({read.node_id for read in reads}),),
    ).fetchall()
    by_id = {str(r[0]): (r[1], ControlState(str(r[2]), str(r[3]), int(r[4]))) for r in rows}
    answers: list[tuple[ControlState | None, None]] = []
    for read in reads:
        found = by_id.get(read.node_id)
        if found is not None and found[0] == public_key_sha256(read.key):
            answers.append((found[1], None))
        else:
            answers.append((None, None))
    return answers


def control_connect(
    conn: psycopg.Connection[Any], node_id: str, key: ec.EllipticCurvePublicKey, server_id: str
) -> ControlState | None:
    """`control_state`, with an accepted node recorded as connected to SERVER_ID in the same
    statement: one round trip for a stream that comes up, as thousands do after a server is
    lost."""
    row = conn.execute(
        "UPDATE nodes SET server = %s, last_seen = now()"
        " WHERE id = %s AND public_key_sha256 = %s AND state = 'accepted'"
        " RETURNING tenant, revision",
        (server_id, node_id, public_key_sha256(key)),
    ).fetchone()
    if row is not None:
        return ControlState("accepted", str(row[0]), int(row[1]))
    return control_state(conn, node_id, key)


def connected(conn: psycopg.Connection[Any], node_id: str, server_id: str) -> None:
    conn.execute(
        "UPDATE nodes SET server = %s, last_seen = now() WHERE id = %s", (server_id, node_id)
    )


def set_max_jobs(conn: psycopg.Connection[Any], node_id: str, count: int) -> None:
    """How many attempts the node says it runs at once (placement's bound); unchanged rows
    are not written, as every stream of the node says it again."""
    conn.execute(
        "UPDATE nodes SET max_jobs = %s WHERE id = %s AND max_jobs <> %s",
        (count, node_id, count),
    )


def _id_list(node_ids: list[str]) -> str:
    """NODE_IDS as one text parameter for string_to_array: an edge sends thousands of IDs
    every second or so, and one string costs psycopg nothing next to a list's dumper.
    Node IDs never hold a comma (new_node_id, NODE_ID)."""
    return ",".join(node_ids)


# The rows of an edge's many-node writes, locked in ID order first. Every write that
# locks several nodes' rows takes them in ID order (the API's too: write_changes,
# _lock_many), so two of them wait for each other instead of deadlocking; in the order of a
# scan of the table, a burst of blocks and an edge's round of `seen` deadlocked, and the
# one PostgreSQL chose to fail was an operator's request as often as the edge's.
_IN_ID_ORDER = (
    "id IN (SELECT id FROM nodes WHERE id = ANY(string_to_array(%s, ',')) ORDER BY id FOR UPDATE)"
)


def seen(conn: psycopg.Connection[Any], node_ids: list[str], server_id: str) -> None:
    conn.execute(
        "UPDATE nodes SET server = %s, last_seen = now() WHERE " + _IN_ID_ORDER,
        (server_id, _id_list(node_ids)),
    )


def disconnected(conn: psycopg.Connection[Any], node_ids: list[str], server_id: str) -> None:
    """Clear the nodes' server, unless they have since connected to another one."""
    conn.execute(
        "UPDATE nodes SET server = NULL WHERE " + _IN_ID_ORDER + " AND server = %s",
        (_id_list(node_ids), server_id),
    )


def streams_recorded(
    conn: psycopg.Connection[Any], seen_ids: list[str], gone_ids: list[str], server_id: str
) -> None:
    """An edge's round: the streams of GONE_IDS ended, those of SEEN_IDS heard from; the
    rows of both locked together in ID order first (one after the other, each in order,
    would still cross a batch of blocks)."""
    if seen_ids and gone_ids:
        conn.execute("SELECT 1 FROM nodes WHERE " + _IN_ID_ORDER, (_id_list(seen_ids + gone_ids),))
    if gone_ids:
        disconnected(conn, gone_ids, server_id)
    if seen_ids:
        seen(conn, seen_ids, server_id)


def not_accepted(conn: psycopg.Connection[Any], node_ids: list[str]) -> list[str]:
    """Those of NODE_IDS that are no longer accepted (or no longer exist)."""
    rows = conn.execute(
        "SELECT wanted.id FROM unnest(string_to_array(%s, ',')) AS wanted(id)"
        " WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = wanted.id AND n.state = 'accepted')",
        (_id_list(node_ids),),
    ).fetchall()
    return [str(r[0]) for r in rows]
