"""Nodes: the machines of the fleet, each a row of `nodes`; every caller uses them as
`from oz0 import nodes` and the names below.

The modules beside this one, each a concern, lowest first:

- `_rules`: what a node ID, a label and a state are; the limits of one request. No SQL.
- `_model`: `Node` as operators see it, `CONNECTED` (shared with job placement), `get`.
- `_listing`: `NodeFilter` (state, tenant, label, search) and the listings and counts
  that take it, in (joined_at, id) order, paged by cursor or offset.
- `_joining`: a node's join request, repeated, and a pending node's pickup of its answer.
- `_streams`: what the edges record of the control streams (connected where, when).
- `_states`: the state machine of one node: accept, reject, block, unblock, delete, purge.
- `_bulk`: many nodes blocked or unblocked in one request, and single-node changes that
  arrive together, written in a few statements.
"""

from oz0.nodes._bulk import (
    NodeChange,
    Selection,
    block_many,
    select_ids,
    select_labels,
    unblock_many,
    write_changes,
)
from oz0.nodes._joining import (
    Joined,
    Pickup,
    TooManyPending,
    check_room_for_pending,
    issue_certificate,
    join,
    pickup,
    rejoin,
)
from oz0.nodes._listing import (
    LabelFilter,
    NodeFilter,
    count_nodes,
    cursor_after,
    list_nodes,
    list_page,
    list_page_json,
    parse_label_filter,
)
from oz0.nodes._model import (
    CONNECTED,
    CONNECTED_PARAMS,
    HEARTBEAT,
    SILENT_AFTER,
    Node,
    get,
    get_many,
    public_key_sha256,
)
from oz0.nodes._rules import (
    DEFAULT_TENANT,
    MAX_IDS_PER_REQUEST,
    MAX_LABELS,
    MAX_PENDING,
    MAX_PER_REQUEST,
    STATES,
    NodeError,
    NodeNotFound,
    TooManyNodes,
    check_id_count,
    check_labels,
    check_node_id,
    is_node_id,
    new_node_id,
    under_token,
)
from oz0.nodes._states import (
    ACTIONS_FROM,
    MAX_REASON,
    accept,
    actions,
    allowed,
    block,
    delete,
    purge,
    purge_refused,
    purged,
    reject,
    unblock,
)
from oz0.nodes._streams import (
    ControlState,
    ControlStateRead,
    connected,
    control_connect,
    control_state,
    control_states,
    disconnected,
    not_accepted,
    seen,
    streams_recorded,
)

__all__ = [
    "ACTIONS_FROM",
    "CONNECTED",
    "CONNECTED_PARAMS",
    "DEFAULT_TENANT",
    "HEARTBEAT",
    "MAX_IDS_PER_REQUEST",
    "MAX_LABELS",
    "MAX_PENDING",
    "MAX_PER_REQUEST",
    "MAX_REASON",
    "SILENT_AFTER",
    "STATES",
    "ControlState",
    "ControlStateRead",
    "Joined",
    "LabelFilter",
    "Node",
    "NodeChange",
    "NodeError",
    "NodeFilter",
    "NodeNotFound",
    "Pickup",
    "Selection",
    "TooManyNodes",
    "TooManyPending",
    "accept",
    "actions",
    "allowed",
    "block",
    "block_many",
    "check_id_count",
    "check_labels",
    "check_node_id",
    "check_room_for_pending",
    "connected",
    "control_connect",
    "control_state",
    "control_states",
    "count_nodes",
    "cursor_after",
    "delete",
    "disconnected",
    "get",
    "get_many",
    "is_node_id",
    "issue_certificate",
    "join",
    "list_nodes",
    "list_page",
    "list_page_json",
    "new_node_id",
    "not_accepted",
    "parse_label_filter",
    "pickup",
    "public_key_sha256",
    "purge",
    "purge_refused",
    "purged",
    "reject",
    "rejoin",
    "seen",
    "select_ids",
    "select_labels",
    "streams_recorded",
    "unblock",
    "unblock_many",
    "under_token",
    "write_changes",
]
