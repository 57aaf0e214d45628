"""What a node ID and node labels look like, and how many nodes one request may name.

Pure rules, apart from `oz0.nodes` so that the command line can check what an operator
typed without loading psycopg and the rest of the server (`oz0.nodes` re-exports them).
"""

from __future__ import annotations

import re

from oz0 import label_rules
from oz0.errors import Oz0Error
from oz0.label_rules import LABEL_KEY as LABEL_KEY

DEFAULT_TENANT = "default"
NODE_ID = re.compile(r"^node-[0-9a-f]{12}$")
MAX_LABELS = 64
# Nodes waiting for an operator, cluster-wide: tokenless joins beyond it are refused.
MAX_PENDING = 1000
# Nodes one block or unblock request may change: named by ID (as many as fit well inside
# the API's 64 KiB body), or matched by a selector. More is refused, nothing changed.
MAX_IDS_PER_REQUEST = 2_000
MAX_PER_REQUEST = 10_000


class NodeError(Oz0Error):
    pass


class TooManyNodes(NodeError):
    pass


class BadNodeInput(NodeError):
    """What was asked of a node is malformed: bad input (400), not a node whose state
    forbids a change (409)."""


class InvalidNodeId(BadNodeInput):
    """Not a node ID at all."""


def is_node_id(text: str) -> bool:
    return NODE_ID.fullmatch(text) is not None


def check_node_id(node_id: str) -> str:
    if not NODE_ID.fullmatch(node_id):
        raise InvalidNodeId(f"invalid node ID {node_id!r}: node IDs look like node-0123456789ab")
    return node_id


def check_labels(labels: object) -> dict[str, str]:
    if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
        raise NodeError(f"labels must be an object of at most {MAX_LABELS} KEY: VALUE pairs")
    label_rules.check_labels(labels, NodeError)
    return dict(labels)


class LabelsRefused(NodeError):
    """A joining node claimed labels where only its token's count (LABELS: those claimed
    beyond the token's); TOKEN_ID: the token, once known, for the audit row."""

    def __init__(self, message: str, labels: dict[str, str]) -> None:
        super().__init__(message)
        self.labels = labels
        self.token_id: str | None = None


def under_token(
    token_labels: dict[str, str], labels: dict[str, str], *, locked_by: str | None = None
) -> dict[str, str]:
    """A joining node's labels: its token's, plus the node's own for the keys the token does
    not set. A label of the node that gives a token's key another value is refused: the
    token is what an operator decided, and a selector on that key must not attract a node
    that only claims it (a "laptops" token's node joining as role=db-prod). LOCKED_BY ("this
    join token", "this cluster"): the token's labels are all the node gets, and any label it
    claims beyond them refuses the join (LabelsRefused): refused, not dropped, so whoever
    starts the agent learns at once that its labels do not count, rather than later from
    jobs that never find the node."""
    contradictions = [
        f"label {key}={value} contradicts the token's {key}={token_labels[key]}"
        for key, value in sorted(labels.items())
        if key in token_labels and token_labels[key] != value
    ]
    if contradictions:
        raise NodeError("; ".join(contradictions))
    claimed = {k: v for k, v in sorted(labels.items()) if k not in token_labels}
    if locked_by is not None and claimed:
        given = ",".join(f"{k}={v}" for k, v in sorted(token_labels.items())) or "none"
        raise LabelsRefused(
            f"label{'s' if len(claimed) > 1 else ''} "
            + ",".join(f"{k}={v}" for k, v in claimed.items())
            + f" refused: {locked_by} gives a node its token's labels only ({given});"
            " start the agent without --label",
            claimed,
        )
    return {**labels, **token_labels}


def check_id_count(count: int) -> None:
    if count > MAX_IDS_PER_REQUEST:
        raise TooManyNodes(
            f"{count} nodes named; at most {MAX_IDS_PER_REQUEST} per request: split them up,"
            f" or select them by label (up to {MAX_PER_REQUEST})"
        )
