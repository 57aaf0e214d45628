"""The audit log: one row per mutating command, written in the command's transaction."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal, get_args

import psycopg
from psycopg.types.json import Jsonb

ActorKind = Literal["operator", "node", "server", "ui"]


@dataclass(frozen=True)
class Actor:
    kind: ActorKind
    name: str


def record(
    conn: psycopg.Connection[Any],
    actor: Actor,
    action: str,
    target: str,
    details: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        "INSERT INTO audit_log (actor_kind, actor, action, target, details)"
        " VALUES (%s, %s, %s, %s, %s)",
        (actor.kind, actor.name, action, target, Jsonb(details or {})),
    )


def record_many(
    conn: psycopg.Connection[Any],
    actor: Actor,
    action: str,
    rows: list[tuple[str, dict[str, Any]]],
) -> None:
    """One row per (target, details) of ROWS, all by ACTOR doing ACTION, in one statement."""
    if not rows:
        return
    conn.execute(
        "INSERT INTO audit_log (actor_kind, actor, action, target, details)"
        " SELECT %s, %s, %s, target, details FROM unnest(%s::text[], %s::jsonb[])"
        " WITH ORDINALITY AS r(target, details, n) ORDER BY n",
        (actor.kind, actor.name, action, [t for t, _ in rows], [Jsonb(d) for _, d in rows]),
    )


@dataclass(frozen=True)
class Entry:
    id: int
    at: dt.datetime
    actor_kind: str
    actor: str
    action: str
    target: str
    details: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "time": self.at.isoformat(),
            "actor": {"kind": self.actor_kind, "name": self.actor},
            "action": self.action,
            "target": self.target,
            "details": self.details,
        }


@dataclass(frozen=True)
class Filters:
    """Which rows: exact ACTION, ACTOR (`kind:name`, or a bare name of any kind) and TARGET."""

    action: str | None = None
    actor: str | None = None
    target: str | None = None

    def _params(self) -> dict[str, Any]:
        # `server:local:box` is kind server, name local:box; `local:box` is a bare name.
        kind, _, name = (self.actor or "").partition(":")
        if kind not in get_args(ActorKind):
            kind, name = "", self.actor or ""
        return {
            "action": self.action,
            "target": self.target,
            "actor_kind": kind or None,
            "actor": name or None,
        }


_WHERE = (
    " WHERE (%(action)s::text IS NULL OR action = %(action)s)"
    "   AND (%(target)s::text IS NULL OR target = %(target)s)"
    "   AND (%(actor_kind)s::text IS NULL OR actor_kind = %(actor_kind)s)"
    "   AND (%(actor)s::text IS NULL OR actor = %(actor)s)"
)


def cursor(raw: str | None) -> int | None:
    """RAW as a `before` cursor (an entry id: ASCII digits that fit a bigint), else None."""
    if raw and raw.isascii() and raw.isdigit() and len(raw) <= 18:
        return int(raw)
    return None


def entries(
    conn: psycopg.Connection[Any],
    *,
    action: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    before: int | None = None,
    limit: int = 100,
) -> list[Entry]:
    """The newest LIMIT rows older than id BEFORE (keyset paging), newest first, filtered
    by exact ACTION, ACTOR (`ui:admin`, or `admin` of any kind) and TARGET."""
    rows = conn.execute(
        "SELECT id, at, actor_kind, actor, action, target, details FROM audit_log"
        + _WHERE
        + " AND (%(before)s::bigint IS NULL OR id < %(before)s)"
        " ORDER BY id DESC LIMIT %(limit)s",
        {**Filters(action, actor, target)._params(), "before": before, "limit": limit},
    ).fetchall()
    return [Entry(*row) for row in rows]


def newer_page(
    conn: psycopg.Connection[Any], filters: Filters, newest_shown: int, limit: int
) -> int | None:
    """The `before` cursor of the page of LIMIT rows just newer than id NEWEST_SHOWN: None
    when there are none, 0 when that page is the first one (no cursor needed)."""
    rows = conn.execute(
        "SELECT id FROM audit_log" + _WHERE + " AND id > %(after)s ORDER BY id LIMIT %(n)s",
        {**filters._params(), "after": newest_shown, "n": limit + 1},
    ).fetchall()
    if not rows:
        return None
    if len(rows) <= limit:
        return 0
    return int(rows[limit - 1][0]) + 1


def actions_seen(conn: psycopg.Connection[Any]) -> list[str]:
    """Every action in the log, sorted: a skip scan of the (action, id) index, one probe a
    distinct action, however many rows there are."""
    rows = conn.execute(
        "WITH RECURSIVE seen (action) AS ("
        "  SELECT min(action) FROM audit_log"
        "  UNION ALL"
        "  SELECT (SELECT min(action) FROM audit_log WHERE action > seen.action)"
        "  FROM seen WHERE seen.action IS NOT NULL"
        ") SELECT action FROM seen WHERE action IS NOT NULL"
    ).fetchall()
    return [str(r[0]) for r in rows]
