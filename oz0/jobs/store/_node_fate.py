"""What became of a node, for its attempts: why one ended (gone_because) and the running
attempts whose node was taken away (blocked, purged, deleted), whose workflows the sweeper
(role.py) tells to move them."""

from __future__ import annotations

from dataclasses import dataclass

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.store._records import Conn


@dataclass(frozen=True)
class Removed:
    """A running attempt whose node is no longer accepted: its workflow must move it."""

    job_id: str
    tenant: str
    number: int
    because: EndReason


# What became of a node, as gone_because reads it: its state, or for a node no longer
# there, whether it went by a purge (the node answered it, and was forgotten) or a delete;
# a purge's answer can come before any server looked at the `purging` state.
_NODE_FATE = (
    "coalesce(n.state, (SELECT CASE WHEN l.action = 'node.purged' THEN 'purged' END"
    " FROM audit_log l WHERE l.target = 'node:' || a.node_id"
    " AND l.action IN ('node.purged', 'node.delete') ORDER BY l.id DESC LIMIT 1))"
)


def node_fate(conn: Conn, node_id: str) -> str | None:
    """What became of NODE_ID, as _NODE_FATE reads it: its state ("accepted" while it may
    run work), "purged", or None for a node deleted or never known."""
    row = conn.execute(
        f"SELECT {_NODE_FATE} FROM (SELECT %s::text AS node_id) AS a"
        " LEFT JOIN nodes n ON n.id = a.node_id",
        (node_id,),
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def removed_attempts(conn: Conn) -> list[Removed]:
    """The running attempts whose node was taken away, their workflow not told yet."""
    rows = conn.execute(
        f"SELECT a.job_id, j.tenant, a.number, {_NODE_FATE} FROM job_attempts a"
        " JOIN jobs j ON j.id = a.job_id LEFT JOIN nodes n ON n.id = a.node_id"
        " WHERE a.state = 'running' AND NOT a.removal_signalled"
        " AND (n.state IS NULL OR n.state <> 'accepted')"
    ).fetchall()
    return [Removed(r[0], r[1], r[2], gone_because(r[3])) for r in rows]


def removal_signalled(conn: Conn, job_id: str, number: int) -> None:
    conn.execute(
        "UPDATE job_attempts SET removal_signalled = true WHERE job_id = %s AND number = %s",
        (job_id, number),
    )


def gone_because(node_state: str | None) -> EndReason:
    """Why an attempt ended, from what became of its node."""
    if node_state is None:
        return EndReason.NODE_DELETED
    return {
        "blocked": EndReason.NODE_BLOCKED,
        "purging": EndReason.NODE_PURGED,
        "purged": EndReason.NODE_PURGED,
    }.get(node_state, EndReason.NODE_LOST)
