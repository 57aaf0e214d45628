"""Many nodes changed in one request (a block or unblock of nodes named or selected by
label), and single-node blocks and unblocks that arrive together, written in a few
statements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from oz0 import audit, listing
from oz0.nodes._model import Node, get_many
from oz0.nodes._rules import (
    MAX_PER_REQUEST,
    NodeError,
    NodeNotFound,
    TooManyNodes,
    check_id_count,
    check_labels,
    check_node_id,
)
from oz0.nodes._states import ACTIONS_FROM, allowed, block, checked_reason, unblock


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
    tenant: str


_LOCKED_COLUMNS = "SELECT id, state, certificate IS NOT NULL, tenant FROM nodes"


def _lock_many(
    conn: psycopg.Connection[Any],
    selection: Selection,
    action: str,
    what: str,
    scope: listing.Scope,
) -> list[_LockedRow]:
    """The nodes of SELECTION in SCOPE's tenants (None: all; another tenant's node named by
    its ID is not found, as an unknown one), locked (in ID order, so that two requests that
    overlap wait for each other rather than deadlock); each one allowed ACTION, or
    NodeError naming the first that is not (WHAT says which states are)."""
    if selection.selector is None:
        named = listing.Where().also("id = ANY(%(ids)s)", ids=list(selection.ids))
        named = named.within("tenant", scope)
        rows = conn.execute(
            _LOCKED_COLUMNS + named.sql + " ORDER BY id FOR UPDATE", named.params
        ).fetchall()
        found = {str(r[0]): _LockedRow(str(r[0]), str(r[1]), bool(r[2]), str(r[3])) for r in rows}
        missing = [n for n in selection.ids if n not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise NodeNotFound(f"node {missing[0]} not found{more}; nothing was changed")
        locked = [found[n] for n in selection.ids]
        for row in locked:
            if not allowed(action, row.state, has_certificate=row.has_certificate):
                raise NodeError(f"node {row.id} is {row.state}; {what}; nothing was changed")
        return locked
    where = (
        listing.Where()
        .also("labels @> %(labels)s", labels=Jsonb(selection.selector))
        .also("state = ANY(%(states)s)", states=list(ACTIONS_FROM[action]))
        .equal("tenant", selection.tenant)
        .within("tenant", scope)
    )
    rows = conn.execute(
        _LOCKED_COLUMNS + where.sql
        + " ORDER BY id LIMIT %(most)s FOR UPDATE",
        {**where.params, "most": MAX_PER_REQUEST + 1},
    ).fetchall()  # fmt: skip
    if not rows:
        raise NodeNotFound(f"no node matches {selection.describe()}; {what}")
    if len(rows) > MAX_PER_REQUEST:
        raise TooManyNodes(
            f"more than {MAX_PER_REQUEST} nodes match {selection.describe()}, the most one"
            " request may change: narrow the selector; nothing was changed"
        )
    return [_LockedRow(str(r[0]), str(r[1]), bool(r[2]), str(r[3])) for r in rows]


def _in_order(conn: psycopg.Connection[Any], ids: list[str]) -> list[Node]:
    by_id = {n.id: n for n in get_many(conn, ids)}
    return [by_id[n] for n in ids]


def block_many(
    conn: psycopg.Connection[Any],
    selection: Selection,
    actor: audit.Actor,
    reason: str,
    *,
    scope: listing.Scope = None,
) -> list[Node]:
    """Block every node of SELECTION in SCOPE's tenants (None: all) in this one
    transaction, or none: one audit row each.

    Each row's update notifies `oz0_nodes` (the trigger of migration 0006); PostgreSQL
    delivers a transaction's notifications together at its commit, so every edge learns of
    the whole burst in one read of its LISTEN connection.
    """
    checked = checked_reason(reason, required=True)
    locked = _lock_many(
        conn, selection, "block", "only pending and accepted nodes can be blocked", scope
    )
    ids = [row.id for row in locked]
    conn.execute(
        "UPDATE nodes SET state = 'blocked', reason = %s WHERE id = ANY(%s)", (checked, ids)
    )
    audit.record_many(
        conn,
        actor,
        "node.block",
        [(f"node:{row.id}", {"reason": checked, "was": row.state}) for row in locked],
        tenants=[[row.tenant] for row in locked],
    )
    return _in_order(conn, ids)


def unblock_many(
    conn: psycopg.Connection[Any],
    selection: Selection,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> list[Node]:
    """Unblock every node of SELECTION in SCOPE's tenants in this one transaction, or none
    (see block_many)."""
    locked = _lock_many(conn, selection, "unblock", "only blocked nodes can be unblocked", scope)
    back = {row.id: "accepted" if row.has_certificate else "pending" for row in locked}
    for now in ("accepted", "pending"):
        ids = [node_id for node_id, state in back.items() if state == now]
        if ids:
            conn.execute(
                "UPDATE nodes SET state = %s, reason = NULL WHERE id = ANY(%s)", (now, ids)
            )
    audit.record_many(
        conn, actor, "node.unblock", [(f"node:{n}", {"now": now}) for n, now in back.items()],
        tenants=[[row.tenant] for row in locked],
    )  # fmt: skip
    return _in_order(conn, list(back))


# --- single-node blocks and unblocks that arrive together ---------------------------------


@dataclass(frozen=True)
class NodeChange:
    """One request's block (with its REASON) or unblock of one node, by ACTOR, who reaches
    SCOPE's tenants (None: all). Called, it is written as `block` or `unblock` would;
    `write_changes` writes many in a few statements."""

    action: str  # "block" or "unblock"
    node_id: str
    actor: audit.Actor
    reason: str | None = None
    scope: listing.Scope = None

    def __call__(self, conn: psycopg.Connection[Any]) -> Node:
        if self.action == "block":
            return block(conn, self.node_id, self.actor, self.reason or "", scope=self.scope)
        return unblock(conn, self.node_id, self.actor, scope=self.scope)


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
            reason = (
                checked_reason(change.reason, required=True) if change.action == "block" else None
            )
        except NodeError as e:
            outcomes[i] = (None, e)
            continue
        wanted.append((i, change, reason))
    rows = conn.execute(
        _LOCKED_COLUMNS + " WHERE id = ANY(%s) ORDER BY id FOR UPDATE",
        (sorted({change.node_id for _, change, _ in wanted}),),
    ).fetchall()
    now: dict[str, tuple[str, bool]] = {str(r[0]): (str(r[1]), bool(r[2])) for r in rows}
    tenant_of: dict[str, str] = {str(r[0]): str(r[3]) for r in rows}
    updated: dict[str, tuple[str, str | None]] = {}
    logged: dict[str, list[tuple[audit.Actor, str, dict[str, Any]]]] = {"block": [], "unblock": []}
    done: list[tuple[int, str]] = []
    for i, change, reason in wanted:
        node_id = change.node_id
        # Each change's own scope: the batch mixes requests of different persons.
        if node_id not in now or not listing.reaches(change.scope, tenant_of[node_id]):
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
                tenants = [[tenant_of[target.removeprefix("node:")]] for _, target, _ in audit_rows]
                audit.record_each(conn, f"node.{action}", audit_rows, tenants=tenants)
            by_id = {n.id: n for n in get_many(conn, list(updated))}
        for i, node_id in done:
            outcomes[i] = (by_id[node_id], None)
    return outcomes
