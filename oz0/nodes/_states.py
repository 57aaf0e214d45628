"""The state machine of one node: which actions each state allows, and each action (accept,
reject, block, unblock, delete, purge and the node's answer to its purge), audited."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg.types.json import Jsonb

from oz0 import audit, listing, pki
from oz0.nodes._joining import issue_certificate
from oz0.nodes._model import CONNECTED_PARAMS, SELECT, Node, get, public_key_sha256
from oz0.nodes._rules import STATES, BadNodeInput, NodeError, NodeNotFound, check_node_id


@dataclass(frozen=True)
class _Locked:
    state: str
    public_pem: str
    # Accepted once: a node blocked while pending never was, and has no control stream.
    has_certificate: bool
    tenant: str


def _locked(conn: psycopg.Connection[Any], node_id: str, scope: listing.Scope) -> _Locked:
    """NODE_ID's row, locked; NodeNotFound if there is none in SCOPE's tenants (another
    tenant's node is answered as an unknown one is)."""
    where = listing.Where().also("id = %(id)s", id=check_node_id(node_id)).within("tenant", scope)
    row = conn.execute(
        "SELECT state, public_key, certificate IS NOT NULL, tenant FROM nodes"
        + where.sql + " FOR UPDATE",
        where.params,
    ).fetchone()  # fmt: skip
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return _Locked(str(row[0]), str(row[1] or ""), bool(row[2]), str(row[3]))


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
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    node_id: str,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> Node:
    """Accept a pending node of SCOPE's tenants (None: any; as for every action below)."""
    locked = _locked(conn, node_id, scope)
    if not allowed("accept", locked.state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {locked.state}; only pending nodes can be accepted")
    public_key = serialization.load_pem_public_key(locked.public_pem.encode())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    conn.execute(
        "UPDATE nodes SET state = 'accepted', reason = NULL, certificate = %s WHERE id = %s",
        (issue_certificate(ca, node_id, public_key), node_id),
    )
    audit.record(conn, actor, "node.accept", f"node:{node_id}", tenants=[locked.tenant])
    return get(conn, node_id)


MAX_REASON = 500


def checked_reason(reason: str | None, *, required: bool = False) -> str | None:
    if reason is None or not reason.strip():
        if required:
            raise BadNodeInput("a reason is required: say why, it goes to the audit log")
        return None
    reason = reason.strip()
    if len(reason) > MAX_REASON or not reason.isprintable():
        raise BadNodeInput(
            f"the reason must be one printable line of at most {MAX_REASON} characters"
        )
    return reason


def reject(
    conn: psycopg.Connection[Any],
    node_id: str,
    actor: audit.Actor,
    reason: str | None,
    *,
    scope: listing.Scope = None,
) -> Node:
    reason = checked_reason(reason)
    locked = _locked(conn, node_id, scope)
    state = locked.state
    if not allowed("reject", state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {state}; only pending nodes can be rejected")
    conn.execute(
        "UPDATE nodes SET state = 'rejected', reason = %s WHERE id = %s", (reason, node_id)
    )
    audit.record(
        conn, actor, "node.reject", f"node:{node_id}", {"reason": reason}, tenants=[locked.tenant]
    )
    return get(conn, node_id)


# --- shutting nodes out and removing them ---------------------------------------------


def block(
    conn: psycopg.Connection[Any],
    node_id: str,
    actor: audit.Actor,
    reason: str,
    *,
    scope: listing.Scope = None,
) -> Node:
    """Shut a node out: every edge ends its stream, Temporal refuses it; it keeps its files."""
    checked = checked_reason(reason, required=True)
    locked = _locked(conn, node_id, scope)
    state = locked.state
    if state == "blocked":
        raise NodeError(f"node {node_id} is blocked already")
    if not allowed("block", state, has_certificate=locked.has_certificate):
        raise NodeError(
            f"node {node_id} is {state}; only pending and accepted nodes can be blocked"
        )
    return _changed(
        conn,
        locked,
        node_id,
        "state = 'blocked', reason = %(reason)s",
        {"reason": checked},
        actor,
        "node.block",
        {"reason": checked, "was": state},
    )


def unblock(
    conn: psycopg.Connection[Any],
    node_id: str,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> Node:
    """Let a blocked node back: accepted if it had been accepted, else pending again."""
    locked = _locked(conn, node_id, scope)
    if not allowed("unblock", locked.state, has_certificate=locked.has_certificate):
        raise NodeError(f"node {node_id} is {locked.state}; only blocked nodes can be unblocked")
    now = "accepted" if locked.has_certificate else "pending"
    return _changed(
        conn,
        locked,
        node_id,
        "state = %(now)s, reason = NULL",
        {"now": now},
        actor,
        "node.unblock",
        {"now": now},
    )


def _changed(
    conn: psycopg.Connection[Any],
    locked: _Locked,
    node_id: str,
    assignments: str,
    params: dict[str, Any],
    actor: audit.Actor,
    action: str,
    details: dict[str, Any],
) -> Node:
    """Update NODE_ID (LOCKED, SET ASSIGNMENTS), write its audit row and read it back, in
    one statement: one round trip instead of three for a single block or unblock.

    The CTE named `nodes` is the updated row, so SELECT (and CONNECTED in it) reads the
    node as it is now; inside the CTE itself `nodes` is still the table."""
    row = conn.execute(
        f"WITH nodes AS (UPDATE nodes SET {assignments} WHERE id = %(id)s RETURNING *),"
        " logged AS (INSERT INTO audit_log (actor_kind, actor, action, target, details,"
        " tenants) VALUES (%(actor_kind)s, %(actor)s, %(action)s, %(target)s, %(details)s,"
        " ARRAY[%(tenant)s::text])) " + SELECT,
        {
            **CONNECTED_PARAMS,
            **params,
            "id": node_id,
            "actor_kind": actor.kind,
            "actor": actor.name,
            "action": action,
            "target": f"node:{node_id}",
            "details": Jsonb(details),
            "tenant": locked.tenant,
        },
    ).fetchone()
    if row is None:
        raise NodeNotFound(f"node {node_id} not found")
    return Node(*row)


def delete(
    conn: psycopg.Connection[Any],
    node_id: str,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> Node:
    """Forget a node; its audit history stays and its key may join again as a new node.

    The read locks the row: of two deletes at once, the second finds no node (one audit row).
    """
    node = get(conn, check_node_id(node_id), lock=True, scope=scope)
    conn.execute("DELETE FROM nodes WHERE id = %s", (node_id,))
    audit.record(
        conn, actor, "node.delete", f"node:{node_id}", {"state": node.state, "tenant": node.tenant},
        tenants=[node.tenant],
    )  # fmt: skip
    return node


def purge(
    conn: psycopg.Connection[Any],
    node_id: str,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> Node:
    """Mark a node for removal from its machine: shut out at once, told on its next stream."""
    locked = _locked(conn, node_id, scope)
    state = locked.state
    if state == "purging":
        raise NodeError(f"node {node_id} is being purged already")
    if not allowed("purge", state, has_certificate=locked.has_certificate):
        raise NodeError(
            f"node {node_id} is {state} and has no control stream to be purged through;"
            " use node delete to forget it"
        )
    conn.execute("UPDATE nodes SET state = 'purging' WHERE id = %s", (node_id,))
    audit.record(
        conn, actor, "node.purge", f"node:{node_id}", {"was": state}, tenants=[locked.tenant]
    )
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
        tenants=[row[0]],
    )
    return True


def purge_refused(
    conn: psycopg.Connection[Any], node_id: str, *, reason: str, nonce: str | None, server_id: str
) -> None:
    """A node refused a purge command it was given: the node's word, kept for the operators."""
    row = conn.execute("SELECT tenant FROM nodes WHERE id = %s", (node_id,)).fetchone()
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
        tenants=[row[0]] if row else [],
    )


def _one_line(text: str) -> str:
    """Untrusted text as one printable line of bounded length, for the audit log."""
    return "".join(c if c.isprintable() else "?" for c in text[:MAX_REASON])
