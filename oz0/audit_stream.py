"""The audit log followed (GET /api/v1/events): its rows in the order their transactions
became complete, from a cursor, none skipped and none twice, however the writers'
transactions interleave.

Why not "id above the last one read": an id is taken at INSERT and the row is seen at
COMMIT, and transactions commit in any order. Writer A takes id 7, writer B id 8; B
commits, a reader sees 8 and moves past it; A commits 7, which the reader never reads.

The rule (migration 0032): every row carries its transaction's xid8. A read takes H =
pg_snapshot_xmin(pg_current_snapshot()), the oldest transaction still running in the
PostgreSQL instance (or the next to begin, when none is). Every transaction below H has
ended, committed or rolled back, so its rows are all visible to the read or never will be;
every transaction that has not ended, or has not begun, is at or above H. The read gives
the rows below H after the cursor, in (xid, id) order, which is unique. So:

- nothing skipped: a row not given by a read has its xid at or above that read's H (its
  transaction had not ended), so it sorts after every row that read gave, and a later
  read (whose H is no lower: xids are handed out in order) reaches it once it is complete;
- nothing twice: the cursor only rises, and a read gives only rows after it.

A cursor names the position (xid, id) of the last row given, or (H, 0) once a read has
given every row below H (no row has id 0), so a follower that asks for some kinds only
moves past the rows it does not want. The price: a row waits for every older transaction
of the PostgreSQL instance to end, one that writes no audit row too; a transaction left
open holds the stream back (nothing is lost) until it ends (`held`: a follower reads again
on its own clock, since no notification comes when such a transaction ends).
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from oz0 import audit, listing
from oz0.errors import Oz0Error

# `after=start`: from the oldest row kept.
FROM_START = "start"
# What a kind looks like: an action (`node.join.refused`) or its first parts (`node`).
_KIND = re.compile(r"[a-z0-9_]{1,40}(?:\.[a-z0-9_]{1,40}){0,4}")
MAX_KINDS = 20
_MAX_XID = 2**64 - 1
_MAX_ID = 2**63 - 1


class BadStreamQuery(Oz0Error):
    """A cursor or kind that is not one (HTTP 400, one line)."""


@dataclass(frozen=True, order=True)
class Position:
    """Where a follower is: every row at or before (XID, ID) that it asked for was given."""

    xid: int
    id: int

    def cursor(self) -> str:
        """The opaque cursor a follower resumes from (`after=`)."""
        return listing.encode({"id": self.id, "x": self.xid})


START = Position(0, 0)


def position_of(raw: str) -> Position:
    """The position a cursor the stream gave names (FROM_START: the first); BadStreamQuery
    if RAW is not one."""
    if raw == FROM_START:
        return START
    refused = BadStreamQuery(
        f"after must be a cursor the stream gave (an event's or a keep-alive's), or {FROM_START}"
    )
    try:
        key = listing.decode(raw, {"id": int, "x": int})
    except listing.BadPaging:
        raise refused from None
    xid, row = key["x"], key["id"]
    if not (0 <= xid <= _MAX_XID and 0 <= row <= _MAX_ID):
        raise refused
    return Position(xid, row)


def kinds_of(raw: Sequence[str]) -> tuple[str, ...]:
    """The kinds asked for (`kind=` repeated), sorted and without repeats; BadStreamQuery
    for one that is no action's name or its first parts, or for too many."""
    kinds = sorted(set(raw))
    if len(kinds) > MAX_KINDS:
        raise BadStreamQuery(f"at most {MAX_KINDS} kinds, not {len(kinds)}")
    for kind in kinds:
        if not _KIND.fullmatch(kind):
            shown = kind if len(kind) <= 60 else kind[:60] + "..."
            raise BadStreamQuery(
                f"kind {shown!r} is not an action (node.accept) or its first parts (node)"
            )
    return tuple(kinds)


@dataclass(frozen=True)
class Event:
    """One row as the stream sends it."""

    position: Position
    id: int
    at: dt.datetime
    actor_kind: str
    actor: str
    action: str
    target: str
    details: dict[str, Any]
    tenants: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "cursor": self.position.cursor(),
            "id": self.id,
            "time": self.at.isoformat(),
            "actor": {"kind": self.actor_kind, "name": self.actor},
            "action": self.action,
            "target": self.target,
            "details": self.details,
            "tenants": self.tenants,
        }

    def line(self) -> bytes:
        return json_line(self.to_json())


def json_line(value: dict[str, Any]) -> bytes:
    """VALUE as one line of JSON (ASCII: any control character is an escape), newline-ended."""
    return (json.dumps(value, sort_keys=True, separators=(",", ":")) + "\n").encode()


@dataclass(frozen=True)
class Batch:
    events: list[Event]
    # Where the follower is after these.
    position: Position
    # Whether every row below the horizon was read (else more are there at once).
    complete: bool
    # Whether rows of ended transactions wait behind an older one still running.
    held: bool


def horizon(conn: psycopg.Connection[Any]) -> int:
    """The oldest transaction not ended (module docstring's H)."""
    row = conn.execute("SELECT pg_snapshot_xmin(pg_current_snapshot())::text").fetchone()
    assert row is not None
    return int(row[0])


def now(conn: psycopg.Connection[Any]) -> Position:
    """The position of a follower that wants only what is committed from now on."""
    return Position(horizon(conn), 0)


def read(
    conn: psycopg.Connection[Any],
    after: Position,
    *,
    kinds: Sequence[str] = (),
    scope: listing.Scope = None,
    limit: int = 500,
) -> Batch:
    """The next LIMIT rows after AFTER of ended transactions, of KINDS (an action or its
    first parts; none: every kind), that a person of SCOPE reads (audit.Filters' rule:
    the audit list's)."""
    # Taken first, in a statement of its own: every row below it is complete by then, so
    # the next statement (a later snapshot) sees each of them. Rows of ended transactions
    # at or above it are held behind one still running: whoever waits for news reads again
    # soon, since no notification comes when that one ends (a row committed after this
    # statement notifies).
    row = conn.execute(
        "SELECT h::text, EXISTS (SELECT 1 FROM audit_log WHERE xid >= h)"
        " FROM (SELECT pg_snapshot_xmin(pg_current_snapshot()) AS h) AS now"
    ).fetchone()
    assert row is not None
    below, held = int(row[0]), bool(row[1])
    where = audit.Filters().where(scope)
    where = where.also(
        "xid < %(horizon)s::xid8 AND (xid, id) > (%(xid)s::xid8, %(id)s)",
        horizon=str(below), xid=str(after.xid), id=after.id,
    )  # fmt: skip
    if kinds:
        # `_` is LIKE's any character: escaped, `ui_account` is no pattern.
        families = [kind.replace("_", "\\_") + ".%" for kind in kinds]
        where = where.also(
            "(action = ANY(%(kinds)s) OR action LIKE ANY(%(families)s))",
            kinds=list(kinds), families=families,
        )  # fmt: skip
    rows = conn.execute(
        "SELECT xid::text, id, at, actor_kind, actor, action, target, details, tenants"
        " FROM audit_log" + where.sql + " ORDER BY xid, id LIMIT %(limit)s",
        {**where.params, "limit": limit},
    ).fetchall()
    events = [
        Event(Position(int(r[0]), int(r[1])), int(r[1]), r[2], r[3], r[4], r[5], r[6],
              dict(r[7] or {}), list(r[8] or []))
        for r in rows
    ]  # fmt: skip
    if len(events) >= limit:
        return Batch(events, events[-1].position, complete=False, held=held)
    return Batch(events, max(after, Position(below, 0)), complete=True, held=held)
