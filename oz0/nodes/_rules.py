"""What a node ID, a label and a state are, and how many nodes one request may name: the
rules, with no SQL. Those the command line checks too live in `oz0.node_rules`, which
loads without the rest of this package (psycopg among it)."""

from __future__ import annotations

import secrets

from oz0.node_rules import (
    DEFAULT_TENANT,
    LABEL_KEY,
    MAX_IDS_PER_REQUEST,
    MAX_LABELS,
    MAX_PENDING,
    MAX_PER_REQUEST,
    NODE_ID,
    BadNodeInput,
    InvalidNodeId,
    LabelsRefused,
    NodeError,
    TooManyNodes,
    check_id_count,
    check_labels,
    check_node_id,
    is_node_id,
    under_token,
)

__all__ = [
    "DEFAULT_TENANT",
    "LABEL_KEY",
    "MAX_IDS_PER_REQUEST",
    "MAX_LABELS",
    "MAX_PENDING",
    "MAX_PER_REQUEST",
    "NODE_ID",
    "STATES",
    "BadNodeInput",
    "InvalidNodeId",
    "LabelsRefused",
    "NodeError",
    "NodeNotFound",
    "TooManyNodes",
    "check_id_count",
    "check_labels",
    "check_node_id",
    "is_node_id",
    "new_node_id",
    "under_token",
]

STATES = ("pending", "accepted", "rejected", "blocked", "purging")


class NodeNotFound(NodeError):
    pass


def new_node_id() -> str:
    return "node-" + secrets.token_hex(6)
