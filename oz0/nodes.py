"""Nodes: joining, approval, listing, and what the edge records about their streams."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg.types.json import Jsonb

from oz0 import audit, listing, pki
from oz0.membership import UP_WINDOW

# The rules the command line checks too live in a light module of their own; callers keep
# using them from here.
from oz0.node_rules import DEFAULT_TENANT as DEFAULT_TENANT
from oz0.node_rules import LABEL_KEY as _LABEL_KEY
from oz0.node_rules import MAX_IDS_PER_REQUEST as MAX_IDS_PER_REQUEST
from oz0.node_rules import MAX_LABELS as MAX_LABELS
from oz0.node_rules import MAX_PENDING as MAX_PENDING
from oz0.node_rules import MAX_PER_REQUEST as MAX_PER_REQUEST
from oz0.node_rules import NodeError as NodeError
from oz0.node_rules import TooManyNodes as TooManyNodes
from oz0.node_rules import check_id_count as check_id_count
from oz0.node_rules import check_labels as check_labels
from oz0.node_rules import check_node_id as check_node_id
from oz0.node_rules import is_node_id as is_node_id

STATES = ("pending", "accepted", "rejected", "blocked", "purging")
HEARTBEAT = 5.0
# "A node silent for three heartbeats is shown disconnected."
SILENT_AFTER = dt.timedelta(seconds=3 * HEARTBEAT)
# Serialises tokenless joins so that concurrent ones cannot pass the limit together.
_PENDING_LOCK = 0x6F7A305F70656E64


class NodeNotFound(NodeError):
    pass


class TooManyPending(NodeError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this cluster already has {limit} nodes waiting for an operator, its limit;"
            " ask an operator to accept or reject some, or join with a token"
        )
        self.limit = limit


def check_room_for_pending(conn: psycopg.Connection[Any], limit: int) -> None:
    """Raise TooManyPending if LIMIT nodes are pending; held until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PENDING_LOCK,))
    row = conn.execute("SELECT count(*) FROM nodes WHERE state = 'pending'").fetchone()
    if row is not None and int(row[0]) >= limit:
        raise TooManyPending(limit)


def new_node_id() -> str:
    return "node-" + secrets.token_hex(6)


def public_key_sha256(key: ec.EllipticCurvePublicKey) -> str:
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


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

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "tenant": self.tenant,
            "labels": self.labels,
            "hostname": self.hostname,
            "connected": self.connected,
            "server": self.server if self.connected else None,
            "last_seen": self.last_seen.isoformat() if self.last_seen else None,
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
_SELECT = (
    "SELECT id, state, tenant, labels, hostname, token_id, reason, server, last_seen,"
    f" joined_at, {CONNECTED} AS connected, certificate IS NOT NULL FROM nodes"
)


def get(conn: psycopg.Connection[Any], node_id: str, *, lock: bool = False) -> Node:
    row = conn.execute(
        _SELECT + " WHERE id = %(id)s" + (" FOR UPDATE OF nodes" if lock else ""),
        {**CONNECTED_PARAMS, "id": node_id},
    ).fetchone()
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return Node(*row)


def get_many(conn: psycopg.Connection[Any], node_ids: list[str]) -> list[Node]:
    """The nodes of NODE_IDS that exist, in no particular order."""
    rows = conn.execute(
        _SELECT + " WHERE id = ANY(%(ids)s)", {**CONNECTED_PARAMS, "ids": node_ids}
    ).fetchall()
    return [Node(*r) for r in rows]


LabelFilter = tuple[str, str | None]


def parse_label_filter(text: str) -> LabelFilter:
    """`KEY=VALUE` (a node with that label) or `KEY` (a node with any value for KEY)."""
    key, equals, value = text.partition("=")
    key = key.strip()
    if not _LABEL_KEY.match(key):
        raise NodeError(f"invalid label filter {text!r}: use KEY=VALUE or KEY, e.g. role=web")
    return key, (value if equals else None)


def _where(
    state: str | None,
    tenant: str | None,
    label: LabelFilter | None,
    search: str | None,
    after: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """The WHERE clause of these filters, naming only those given: a condition written as
    `(%(x)s IS NULL OR ...)` would keep a prepared statement's generic plan off the
    indexes of migration 0012. AFTER (a cursor): only the nodes listed after it."""
    if state is not None and state not in STATES:
        raise NodeError(f"unknown state {state!r}: use one of {', '.join(STATES)}")
    conditions = ["TRUE"]
    params: dict[str, Any] = {}
    if state is not None:
        conditions.append("state = %(state)s")
        params["state"] = state
    if tenant is not None:
        conditions.append("tenant = %(tenant)s")
        params["tenant"] = tenant
    if label is not None:
        key, value = label
        if value is None:
            conditions.append("labels ? %(key)s")
            params["key"] = key
        else:
            conditions.append("labels @> %(labels)s")
            params["labels"] = Jsonb({key: value})
    if search is not None:
        # strpos, not LIKE: what is searched for is taken literally, `%` and `_` too. No
        # index serves it (see migration 0012): rows are read in listing order until a
        # page is full. An ID is lower case already (its CHECK), a host name is ASCII
        # (oz0.node_strings), so Python's lower() is PostgreSQL's here; done once, not in
        # each row as a prepared statement's generic plan would do it.
        conditions.append("(strpos(id, %(search)s) > 0 OR strpos(hostname_lower, %(search)s) > 0)")
        params["search"] = search.lower()
    if after is not None:
        # A row comparison: the listing indexes read from this key on, in order.
        params["after_at"], params["after_id"] = _listing_key(after)
        conditions.append("(joined_at, id) > (%(after_at)s, %(after_id)s)")
    return " WHERE " + " AND ".join(conditions), params


def cursor_after(node: Node) -> str:
    """The cursor of the page after one ending with NODE: its place in the listing order."""
    return _cursor(node.joined_at, node.id)


def _cursor(joined_at: dt.datetime, node_id: str) -> str:
    return listing.encode({"joined_at": joined_at.isoformat(), "id": node_id})


def _listing_key(cursor: str) -> tuple[dt.datetime, str]:
    key = listing.decode(cursor, {"joined_at": str, "id": str})
    try:
        joined_at = dt.datetime.fromisoformat(key["joined_at"])
    except ValueError:
        joined_at = None
    if joined_at is None or joined_at.tzinfo is None:
        raise listing.malformed()
    return joined_at, key["id"]


def list_nodes(
    conn: psycopg.Connection[Any],
    *,
    state: str | None = None,
    tenant: str | None = None,
    label: LabelFilter | None = None,
    search: str | None = None,
    limit: int | None = None,
    offset: int = 0,
    after: str | None = None,
) -> list[Node]:
    """The nodes matching every filter given, oldest first (by joined_at, then ID); SEARCH
    is a case-insensitive part of the ID or host name. AFTER (a cursor, `cursor_after`)
    starts after that node; LIMIT and OFFSET page through them (no LIMIT: all). Raises
    listing.BadPaging for a malformed cursor."""
    where, params = _where(state, tenant, label, search, after)
    order = " ORDER BY joined_at, id"
    if offset:
        # The rows skipped are read as IDs only (from the listing indexes where they
        # cover the filters), not as whole rows with their connection worked out.
        where = (
            " WHERE id IN (SELECT id FROM nodes" + where + order
            + " LIMIT %(limit)s OFFSET %(offset)s)"
        )  # fmt: skip
    rows = conn.execute(
        _SELECT + where + order + " LIMIT %(limit)s",
        {**CONNECTED_PARAMS, **params, "limit": limit, "offset": offset},
    ).fetchall()
    return [Node(*r) for r in rows]


def list_page(
    conn: psycopg.Connection[Any],
    *,
    state: str | None = None,
    tenant: str | None = None,
    label: LabelFilter | None = None,
    search: str | None = None,
    limit: int = listing.DEFAULT_LIMIT,
    after: str | None = None,
) -> tuple[list[Node], str | None]:
    """One page of `list_nodes` and the cursor of the next one (None: this is the last)."""
    found = list_nodes(
        conn, state=state, tenant=tenant, label=label, search=search, limit=limit + 1,
        after=after,
    )  # fmt: skip
    if len(found) <= limit:
        return found, None
    return found[:limit], cursor_after(found[limit - 1])


# What Node.to_json gives, as JSON text written by PostgreSQL, keys sorted as the API's
# JSON encoder sorts them: a page of the API costs no Node, no dict and no encoding a row
# in the server's one thread (about half its CPU time a page of 500 before).
_PAGE_JSON = (
    "SELECT json_build_object("
    "'connected', connected, 'hostname', hostname, 'id', id,"
    f" 'joined_at', {listing.iso_sql('joined_at')},"
    " 'labels', coalesce((SELECT json_object_agg(k, v ORDER BY k COLLATE \"C\")"
    "   FROM jsonb_each(labels) AS l(k, v)), '{}'::json),"
    f" 'last_seen', CASE WHEN last_seen IS NOT NULL THEN {listing.iso_sql('last_seen')} END,"
    " 'reason', reason, 'server', CASE WHEN connected THEN server END, 'state', state,"
    " 'tenant', tenant, 'token_id', token_id)::text, joined_at, id"
    f" FROM (SELECT nodes.*, {CONNECTED} AS connected FROM nodes"
)


def list_page_json(
    conn: psycopg.Connection[Any],
    *,
    state: str | None = None,
    tenant: str | None = None,
    label: LabelFilter | None = None,
    search: str | None = None,
    limit: int = listing.DEFAULT_LIMIT,
    after: str | None = None,
) -> tuple[list[str], str | None]:
    """`list_page`, each node as the JSON text of its to_json(), for the API."""
    where, params = _where(state, tenant, label, search, after)
    rows = conn.execute(
        _PAGE_JSON + where + " ORDER BY joined_at, id LIMIT %(limit)s) AS page"
        " ORDER BY joined_at, id",
        {**CONNECTED_PARAMS, **params, "limit": limit + 1},
    ).fetchall()
    if len(rows) <= limit:
        return [r[0] for r in rows], None
    _, joined_at, node_id = rows[limit - 1]
    return [r[0] for r in rows[:limit]], _cursor(joined_at, node_id)


def count_nodes(
    conn: psycopg.Connection[Any],
    *,
    state: str | None = None,
    tenant: str | None = None,
    label: LabelFilter | None = None,
    search: str | None = None,
    most: int | None = None,
) -> int:
    """How many nodes `list_nodes` with these filters lists, without a LIMIT; counting
    stops at MOST if given (a count of a large fleet reads every row it counts)."""
    where, params = _where(state, tenant, label, search)
    row = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM nodes" + where + " LIMIT %(most)s) AS matching",
        {**params, "most": most},
    ).fetchone()
    return int(row[0]) if row else 0


@dataclass(frozen=True)
class Joined:
    node_id: str
    state: str
    tenant: str
    certificate: str | None


def issue_certificate(
    ca: pki.CertificateAuthority, node_id: str, public_key: ec.EllipticCurvePublicKey
) -> str:
    cert = ca.issue(public_key, name=node_id, role=pki.Role.NODE, validity=pki.node_validity())
    return pki.cert_to_pem(cert).decode()


def join(
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    *,
    csr_pem: str,
    labels: dict[str, str],
    hostname: str,
    token_id: str | None = None,
    token_tenant: str | None = None,
    token_labels: dict[str, str] | None = None,
) -> Joined:
    """Add a node: accepted in the token's tenant when a token was consumed, else pending."""
    try:
        public_key = pki.csr_public_key(csr_pem.encode())
    except ValueError as e:
        raise NodeError(f"bad certificate request: {e}") from None
    labels = check_labels(labels)
    hostname = hostname[:253] if isinstance(hostname, str) else ""
    node_id = new_node_id()
    accepted = token_id is not None
    state = "accepted" if accepted else "pending"
    tenant = token_tenant if accepted and token_tenant else DEFAULT_TENANT
    merged = {**(token_labels or {}), **labels}
    certificate = issue_certificate(ca, node_id, public_key) if accepted else None
    conn.execute(
        "INSERT INTO nodes (id, tenant, state, labels, hostname, token_id, public_key,"
        " public_key_sha256, certificate) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            node_id,
            tenant,
            state,
            Jsonb(merged),
            hostname,
            token_id,
            public_key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode(),
            public_key_sha256(public_key),
            certificate,
        ),
    )
    audit.record(
        conn,
        audit.Actor("node", node_id),
        "node.join",
        f"node:{node_id}",
        {"state": state, "tenant": tenant, "token_id": token_id, "hostname": hostname},
    )
    return Joined(node_id, state, tenant, certificate)


def rejoin(conn: psycopg.Connection[Any], csr_pem: str) -> Joined | None:
    """The node a repeated join of the same key refers to, or None for a new key.

    An agent whose connection broke before the answer asks again; it must get the node it
    already is, not a second one (and must not use its token twice).
    """
    try:
        public_key = pki.csr_public_key(csr_pem.encode())
    except ValueError as e:
        raise NodeError(f"bad certificate request: {e}") from None
    row = conn.execute(
        "SELECT id, state, tenant, certificate FROM nodes WHERE public_key_sha256 = %s",
        (public_key_sha256(public_key),),
    ).fetchone()
    if row is None:
        return None
    node_id, state, tenant, certificate = row
    if state not in ("pending", "accepted"):
        raise NodeError(f"this key belongs to node {node_id}, which is {state}")
    return Joined(str(node_id), str(state), str(tenant), certificate)


@dataclass(frozen=True)
class _Locked:
    state: str
    public_pem: str
    # Accepted once: a node blocked while pending never was, and has no control stream.
    has_certificate: bool


def _locked(conn: psycopg.Connection[Any], node_id: str) -> _Locked:
    row = conn.execute(
        "SELECT state, public_key, certificate IS NOT NULL FROM nodes WHERE id = %s FOR UPDATE",
        (check_node_id(node_id),),
    ).fetchone()
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return _Locked(str(row[0]), str(row[1] or ""), bool(row[2]))


# The states each action is for; `allowed` reads it, and so do the functions below (whose
# refusals say why) and the web UI (which shows a node only the actions it allows).
ACTIONS_FROM: dict[str, tuple[str, ...]] = {
    "accept": ("pending",),
    "reject": ("pending",),
    "block": ("pending", "accepted"),
    "unblock": ("blocked",),
    "delete": STATES,
    "purge": ("accepted", "blocked"),
}


def allowed(action: str, state: str, *, has_certificate: bool) -> bool:
    """Whether ACTION may be taken on a node in STATE; purge also needs a node that was
    accepted once (its control stream is how it is told)."""
    if action == "purge" and not has_certificate:
        return False
    return state in ACTIONS_FROM[action]


def actions(node: Node) -> list[str]:
    """The actions NODE allows now, in the order of ACTIONS_FROM."""
    return [a for a in ACTIONS_FROM if allowed(a, node.state, has_certificate=node.has_certificate)]


def accept(
    conn: psycopg.Connection[Any], ca: pki.CertificateAuthority, node_id: str, actor: audit.Actor
) -> Node:
    locked = _locked(conn, node_id)
    if not allowed("accept", locked.state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {locked.state}; only pending nodes can be accepted")
    public_key = serialization.load_pem_public_key(locked.public_pem.encode())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    conn.execute(
        "UPDATE nodes SET state = 'accepted', reason = NULL, certificate = %s WHERE id = %s",
        (issue_certificate(ca, node_id, public_key), node_id),
    )
    audit.record(conn, actor, "node.accept", f"node:{node_id}")
    return get(conn, node_id)


MAX_REASON = 500


def _reason(reason: str | None, *, required: bool = False) -> str | None:
    if reason is None or not reason.strip():
        if required:
            raise NodeError("a reason is required: say why, it goes to the audit log")
        return None
    reason = reason.strip()
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise NodeError(f"the reason must be one printable line of at most {MAX_REASON} characters")
    return reason


def reject(
    conn: psycopg.Connection[Any], node_id: str, actor: audit.Actor, reason: str | None
) -> Node:
    reason = _reason(reason)
    locked = _locked(conn, node_id)
    state = locked.state
    if not allowed("reject", state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {state}; only pending nodes can be rejected")
    conn.execute(
        "UPDATE nodes SET state = 'rejected', reason = %s WHERE id = %s", (reason, node_id)
    )
    audit.record(conn, actor, "node.reject", f"node:{node_id}", {"reason": reason})
    return get(conn, node_id)


@dataclass(frozen=True)
class Pickup:
    state: str
    certificate: str | None
    reason: str | None
    tenant: str


def pickup(
    conn: psycopg.Connection[Any], node_id: str, challenge: bytes, signature_b64: str
) -> Pickup:
    """The node's state, if the node proves it holds its key by signing CHALLENGE."""
    row = conn.execute(
        "SELECT state, public_key, certificate, reason, tenant FROM nodes WHERE id = %s",
        (node_id,),
    ).fetchone()
    if row is None or not row[1]:
        raise NodeNotFound(f"node {node_id} not found")
    public_key = serialization.load_pem_public_key(str(row[1]).encode())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    try:
        public_key.verify(
            base64.b64decode(signature_b64, validate=True), challenge, ec.ECDSA(hashes.SHA256())
        )
    except (InvalidSignature, ValueError):
        raise NodeNotFound(f"node {node_id} not found") from None
    return Pickup(str(row[0]), row[2], row[3], str(row[4]))


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


# --- shutting nodes out and removing them ---------------------------------------------


def block(conn: psycopg.Connection[Any], node_id: str, actor: audit.Actor, reason: str) -> Node:
    """Shut a node out: every edge ends its stream, Temporal refuses it; it keeps its files."""
    checked = _reason(reason, required=True)
    locked = _locked(conn, node_id)
    state = locked.state
    if state == "blocked":
        raise NodeError(f"node {node_id} is blocked already")
    if not allowed("block", state, has_certificate=locked.has_certificate):
        raise NodeError(
            f"node {node_id} is {state}; only pending and accepted nodes can be blocked"
        )
    return _changed(
        conn,
        node_id,
        "state = 'blocked', reason = %(reason)s",
        {"reason": checked},
        actor,
        "node.block",
        {"reason": checked, "was": state},
    )


def unblock(conn: psycopg.Connection[Any], node_id: str, actor: audit.Actor) -> Node:
    """Let a blocked node back: accepted if it had been accepted, else pending again."""
    locked = _locked(conn, node_id)
    if not allowed("unblock", locked.state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {locked.state}; only blocked nodes can be unblocked")
    now = "accepted" if locked.has_certificate else "pending"
    return _changed(
        conn,
        node_id,
        "state = %(now)s, reason = NULL",
        {"now": now},
        actor,
        "node.unblock",
        {"now": now},
    )


def _changed(
    conn: psycopg.Connection[Any],
    node_id: str,
    assignments: str,
    params: dict[str, Any],
    actor: audit.Actor,
    action: str,
    details: dict[str, Any],
) -> Node:
    """Update NODE_ID (SET ASSIGNMENTS), write its audit row and read it back, in one
    statement: one round trip instead of three for a single block or unblock.

    The CTE named `nodes` is the updated row, so _SELECT (and CONNECTED in it) reads the
    node as it is now; inside the CTE itself `nodes` is still the table."""
    row = conn.execute(
        f"WITH nodes AS (UPDATE nodes SET {assignments} WHERE id = %(id)s RETURNING *),"
        " logged AS (INSERT INTO audit_log (actor_kind, actor, action, target, details)"
        " VALUES (%(actor_kind)s, %(actor)s, %(action)s, %(target)s, %(details)s)) " + _SELECT,
        {
            **CONNECTED_PARAMS,
            **params,
            "id": node_id,
            "actor_kind": actor.kind,
            "actor": actor.name,
            "action": action,
            "target": f"node:{node_id}",
            "details": Jsonb(details),
        },
    ).fetchone()
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return Node(*row)


# --- many nodes at once ------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """Which nodes one request acts on: the IDs given, or those with every label of
    SELECTOR (in TENANT if given) that the action applies to."""

    ids: tuple[str, ...] = ()
    selector: dict[str, str] | None = None
    tenant: str | None = None

    def describe(self) -> str:
        assert self.selector is not None
        pairs = ",".join(f"{k}={v}" for k, v in sorted(self.selector.items()))
        return pairs + (f" in tenant {self.tenant}" if self.tenant is not None else "")


def select_ids(node_ids: list[str]) -> Selection:
    if not node_ids:
        raise NodeError("name at least one node ID")
    unique = list(dict.fromkeys(check_node_id(n) for n in node_ids))
    check_id_count(len(unique))
    return Selection(ids=tuple(unique))


def select_labels(selector: dict[str, str], tenant: str | None) -> Selection:
    if not selector:
        raise NodeError("a selector needs at least one KEY=VALUE label")
    return Selection(selector=check_labels(selector), tenant=tenant)


@dataclass(frozen=True)
class _LockedRow:
    id: str
    state: str
    has_certificate: bool


def _lock_many(
    conn: psycopg.Connection[Any], selection: Selection, action: str, what: str
) -> list[_LockedRow]:
    """The nodes of SELECTION, locked (in ID order, so that two requests that overlap wait
    for each other rather than deadlock); each one allowed ACTION, or NodeError naming the
    first that is not (WHAT says which states are)."""
    if selection.selector is None:
        rows = conn.execute(
            "SELECT id, state, certificate IS NOT NULL FROM nodes WHERE id = ANY(%s)"
            " ORDER BY id FOR UPDATE",
            (list(selection.ids),),
        ).fetchall()
        found = {str(r[0]): _LockedRow(str(r[0]), str(r[1]), bool(r[2])) for r in rows}
        missing = [n for n in selection.ids if n not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise NodeNotFound(f"node {missing[0]} not found{more}; nothing was changed")
        locked = [found[n] for n in selection.ids]
        for row in locked:
            if not allowed(action, row.state, has_certificate=row.has_certificate):
                raise NodeError(f"node {row.id} is {row.state}; {what}; nothing was changed")
        return locked
    rows = conn.execute(
        "SELECT id, state, certificate IS NOT NULL FROM nodes"
        " WHERE labels @> %s AND state = ANY(%s) AND (%s::text IS NULL OR tenant = %s)"
        " ORDER BY id LIMIT %s FOR UPDATE",
        (
            Jsonb(selection.selector),
            list(ACTIONS_FROM[action]),
            selection.tenant,
            selection.tenant,
            MAX_PER_REQUEST + 1,
        ),
    ).fetchall()
    if not rows:
        raise NodeNotFound(f"no node matches {selection.describe()}; {what}")
    if len(rows) > MAX_PER_REQUEST:
        raise TooManyNodes(
            f"more than {MAX_PER_REQUEST} nodes match {selection.describe()}, the most one"
            " request may change: narrow the selector; nothing was changed"
        )
    return [_LockedRow(str(r[0]), str(r[1]), bool(r[2])) for r in rows]


def _in_order(conn: psycopg.Connection[Any], ids: list[str]) -> list[Node]:
    by_id = {n.id: n for n in get_many(conn, ids)}
    return [by_id[n] for n in ids]


def block_many(
    conn: psycopg.Connection[Any], selection: Selection, actor: audit.Actor, reason: str
) -> list[Node]:
    """Block every node of SELECTION in this one transaction, or none: one audit row each.

    Each row's update notifies `oz0_nodes` (the trigger of migration 0006); PostgreSQL
    delivers a transaction's notifications together at its commit, so every edge learns of
    the whole burst in one read of its LISTEN connection.
    """
    checked = _reason(reason, required=True)
    locked = _lock_many(conn, selection, "block", "only pending and accepted nodes can be blocked")
    ids = [row.id for row in locked]
    conn.execute(
        "UPDATE nodes SET state = 'blocked', reason = %s WHERE id = ANY(%s)", (checked, ids)
    )
    audit.record_many(
        conn,
        actor,
        "node.block",
        [(f"node:{row.id}", {"reason": checked, "was": row.state}) for row in locked],
    )
    return _in_order(conn, ids)


def unblock_many(
    conn: psycopg.Connection[Any], selection: Selection, actor: audit.Actor
) -> list[Node]:
    """Unblock every node of SELECTION in this one transaction, or none (see block_many)."""
    locked = _lock_many(conn, selection, "unblock", "only blocked nodes can be unblocked")
    back = {row.id: "accepted" if row.has_certificate else "pending" for row in locked}
    for now in ("accepted", "pending"):
        ids = [node_id for node_id, state in back.items() if state == now]
        if ids:
            conn.execute(
                "UPDATE nodes SET state = %s, reason = NULL WHERE id = ANY(%s)", (now, ids)
            )
    audit.record_many(
        conn, actor, "node.unblock", [(f"node:{n}", {"now": now}) for n, now in back.items()]
    )
    return _in_order(conn, list(back))


# --- single-node blocks and unblocks that arrive together ---------------------------------


@dataclass(frozen=True)
class NodeChange:
    """One request's block (with its REASON) or unblock of one node. Called, it is written
    as `block` or `unblock` would; `write_changes` writes many in a few statements."""

    action: str  # "block" or "unblock"
    node_id: str
    actor: audit.Actor
    reason: str | None = None

    def __call__(self, conn: psycopg.Connection[Any]) -> Node:
        if self.action == "block":
            return block(conn, self.node_id, self.actor, self.reason or "")
        return unblock(conn, self.node_id, self.actor)


def write_changes(
    conn: psycopg.Connection[Any], changes: list[NodeChange]
) -> list[tuple[Node | None, NodeError | None]]:
    """Each of CHANGES as if written one after another in this transaction, in five
    statements whatever their number (a lock, an update, the audit rows of each action, a
    read back; the last four in one round trip) instead of two each: its node as it is
    now, or the NodeError `block` or `unblock` would have raised for it (nothing written
    for that one).

    Fifty `node block` requests at once took 35-70 ms of the server in two statements
    each, half of it the interpreter's, which the requests being parsed need too. A node
    changed twice here (a block and an unblock) answers both with its state at the end.
    """
    outcomes: list[tuple[Node | None, NodeError | None]] = [(None, None)] * len(changes)
    wanted: list[tuple[int, NodeChange, str | None]] = []
    for i, change in enumerate(changes):
        try:
            check_node_id(change.node_id)
            reason = _reason(change.reason, required=True) if change.action == "block" else None
        except NodeError as e:
            outcomes[i] = (None, e)
            continue
        wanted.append((i, change, reason))
    rows = conn.execute(
        "SELECT id, state, certificate IS NOT NULL FROM nodes WHERE id = ANY(%s)"
        " ORDER BY id FOR UPDATE",
        (sorted({change.node_id for _, change, _ in wanted}),),
    ).fetchall()
    now: dict[str, tuple[str, bool]] = {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}
    updated: dict[str, tuple[str, str | None]] = {}
    logged: dict[str, list[tuple[audit.Actor, str, dict[str, Any]]]] = {"block": [], "unblock": []}
    done: list[tuple[int, str]] = []
    for i, change, reason in wanted:
        node_id = change.node_id
        if node_id not in now:
            outcomes[i] = (None, NodeNotFound(f"node {node_id} not found"))
            continue
        state, has_certificate = now[node_id]
        if change.action == "block":
            if state == "blocked":
                outcomes[i] = (None, NodeError(f"node {node_id} is blocked already"))
                continue
            if not allowed("block", state, has_certificate=has_certificate):
                outcomes[i] = (
                    None,
                    NodeError(
                        f"node {node_id} is {state}; only pending and accepted nodes can be blocked"
                    ),
                )
                continue
            updated[node_id] = ("blocked", reason)
            details: dict[str, Any] = {"reason": reason, "was": state}
        else:
            if not allowed("unblock", state, has_certificate=has_certificate):
                outcomes[i] = (
                    None,
                    NodeError(f"node {node_id} is {state}; only blocked nodes can be unblocked"),
                )
                continue
            back = "accepted" if has_certificate else "pending"
            updated[node_id] = (back, None)
            details = {"now": back}
        now[node_id] = (updated[node_id][0], has_certificate)
        logged[change.action].append((change.actor, f"node:{node_id}", details))
        done.append((i, node_id))
    if updated:
        # One round trip for the rest: under load each one waits for the interpreter's
        # lock again in the worker thread that writes the batch.
        with conn.pipeline():
            conn.execute(
                "UPDATE nodes SET state = u.state, reason = u.reason"
                " FROM unnest(%s::text[], %s::text[], %s::text[]) AS u(id, state, reason)"
                " WHERE nodes.id = u.id",
                (
                    list(updated),
                    [state for state, _ in updated.values()],
                    [reason for _, reason in updated.values()],
                ),
            )
            for action, audit_rows in logged.items():
                audit.record_each(conn, f"node.{action}", audit_rows)
            by_id = {n.id: n for n in get_many(conn, list(updated))}
        for i, node_id in done:
            outcomes[i] = (by_id[node_id], None)
    return outcomes


def delete(conn: psycopg.Connection[Any], node_id: str, actor: audit.Actor) -> Node:
    """Forget a node; its audit history stays and its key may join again as a new node.

    The read locks the row: of two deletes at once, the second finds no node (one audit row).
    """
    node = get(conn, check_node_id(node_id), lock=True)
    conn.execute("DELETE FROM nodes WHERE id = %s", (node_id,))
    audit.record(
        conn, actor, "node.delete", f"node:{node_id}", {"state": node.state, "tenant": node.tenant}
    )
    return node


def purge(conn: psycopg.Connection[Any], node_id: str, actor: audit.Actor) -> Node:
    """Mark a node for removal from its machine: shut out at once, told on its next stream."""
    locked = _locked(conn, node_id)
    state = locked.state
    if state == "purging":
        raise NodeError(f"node {node_id} is being purged already")
    if not allowed("purge", state, has_certificate=locked.has_certificate):
        raise NodeError(
            f"node {node_id} is {state} and has no control stream to be purged through;"
            " use node delete to forget it"
        )
    conn.execute("UPDATE nodes SET state = 'purging' WHERE id = %s", (node_id,))
    audit.record(conn, actor, "node.purge", f"node:{node_id}", {"was": state})
    return get(conn, node_id)


def purged(
    conn: psycopg.Connection[Any],
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    *,
    nonce: str,
    server_id: str,
) -> bool:
    """Forget a node that answered its purge command; False if it is no longer purging."""
    row = conn.execute(
        "DELETE FROM nodes WHERE id = %s AND public_key_sha256 = %s AND state = 'purging'"
        " RETURNING tenant",
        (node_id, public_key_sha256(key)),
    ).fetchone()
    if row is None:
        return False
    audit.record(
        conn,
        audit.Actor("node", node_id),
        "node.purged",
        f"node:{node_id}",
        {"nonce": nonce, "server": server_id, "tenant": row[0]},
    )
    return True


def purge_refused(
    conn: psycopg.Connection[Any], node_id: str, *, reason: str, nonce: str | None, server_id: str
) -> None:
    """A node refused a purge command it was given: the node's word, kept for the operators."""
    audit.record(
        conn,
        audit.Actor("node", node_id),
        "node.purge.refused",
        f"node:{node_id}",
        {
            "reason": _one_line(reason),
            "nonce": None if nonce is None else _one_line(nonce)[:64],
            "server": server_id,
        },
    )


def _one_line(text: str) -> str:
    """Untrusted text as one printable line of bounded length, for the audit log."""
    return "".join(c if c.isprintable() else "?" for c in text[:MAX_REASON])


def not_accepted(conn: psycopg.Connection[Any], node_ids: list[str]) -> list[str]:
    """Those of NODE_IDS that are no longer accepted (or no longer exist)."""
    rows = conn.execute(
        "SELECT wanted.id FROM unnest(string_to_array(%s, ',')) AS wanted(id)"
        " WHERE NOT EXISTS (SELECT 1 FROM nodes n WHERE n.id = wanted.id AND n.state = 'accepted')",
        (_id_list(node_ids),),
    ).fetchall()
    return [str(r[0]) for r in rows]
