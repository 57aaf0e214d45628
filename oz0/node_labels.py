"""Whether a joining node's own labels count: the cluster's setting that locks every
node's labels to its token's (`cluster set --lock-node-labels`), and what turning a lock
on waits for during a rolling upgrade. A token locks its own (`token create
--lock-labels`, oz0/tokens.py); the rule is `node_rules.under_token`.

Labels are placement: a job's selector finds nodes by them. Unlocked, a node joining with
a token adds any label its token does not set, and so attracts the jobs that select it.
Locked, the labels of a node joining with a token are the token's, as an operator chose
them; a node that claims more is refused at its join. A node joining without a token
still brings its own: it waits, pending, until an operator who sees them accepts it.
"""

from __future__ import annotations

from typing import Any

import psycopg

from oz0 import audit, membership
from oz0.errors import Oz0Error

# The first schema (migration 0027) whose servers keep a lock; an older one beside it lets
# a node claim labels through its edge.
LOCK_SCHEMA = 27
BY_TOKEN = "this join token"
BY_CLUSTER = "this cluster"


def cluster_locked(conn: psycopg.Connection[Any]) -> bool:
    """Whether the cluster locks every node's labels to its token's."""
    row = conn.execute("SELECT lock_node_labels FROM cluster_settings").fetchone()
    return bool(row and row[0])


def locked_by(token_locks: bool, cluster: bool) -> str | None:
    """Who locks a joining node's labels (as its refusal names it); None: nobody."""
    if token_locks:
        return BY_TOKEN
    return BY_CLUSTER if cluster else None


def check_upgraded(conn: psycopg.Connection[Any], what: str) -> None:
    """Refuse WHAT (a lock) while a server of an earlier release is up: its edge would not
    keep it."""
    if not membership.all_up_at_least(conn, LOCK_SCHEMA):
        raise Oz0Error(
            f"{what} waits for the end of the upgrade: a server of an earlier release is up,"
            " and its edge would let a joining node claim labels"
        )


def set_cluster_lock(conn: psycopg.Connection[Any], locked: bool, actor: audit.Actor) -> bool:
    """Lock every node's labels to its token's (LOCKED) or not; the change is audited
    `cluster.set` (who, from what to what). The setting before."""
    row = conn.execute("SELECT lock_node_labels FROM cluster_settings FOR UPDATE").fetchone()
    before = bool(row and row[0])
    if before != locked:
        if locked:
            check_upgraded(conn, "--lock-node-labels")
        conn.execute("UPDATE cluster_settings SET lock_node_labels = %s", (locked,))
        audit.record(
            conn, actor, "cluster.set", "cluster",
            {"lock_node_labels": {"from": before, "to": locked}},
        )  # fmt: skip
    return before
