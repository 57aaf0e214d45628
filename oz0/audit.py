"""The audit log: one row per mutating command, written in the command's transaction."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any, Literal

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


def entries(
    conn: psycopg.Connection[Any],
    *,
    action: str | None = None,
    target: str | None = None,
    limit: int = 100,
) -> list[Entry]:
    """The newest LIMIT rows, newest first, filtered by exact ACTION and TARGET."""
    rows = conn.execute(
        "SELECT id, at, actor_kind, actor, action, target, details FROM audit_log"
        " WHERE (%(action)s::text IS NULL OR action = %(action)s)"
        "   AND (%(target)s::text IS NULL OR target = %(target)s)"
        " ORDER BY id DESC LIMIT %(limit)s",
        {"action": action, "target": target, "limit": limit},
    ).fetchall()
    return [Entry(*row) for row in rows]
