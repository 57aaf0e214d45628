"""The audit log: one row per mutating command, written in the command's transaction."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, get_args

import psycopg
from psycopg.types.json import Jsonb

from oz0 import listing
from oz0.retention_rules import describe

# "schedule": a schedule's run, starting its job (oz0/jobs/schedules.py).
ActorKind = Literal["operator", "node", "server", "ui", "schedule"]


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
    *,
    tenants: Iterable[str] = (),
) -> None:
    """One row: ACTOR did ACTION to TARGET. TENANTS: which tenants it is about (a node's,
    a job's, a token's tenant); none: the cluster as a whole, a row only cluster-wide
    persons see (so one written without them is hidden from a scoped person, never shown
    to the wrong one)."""
    conn.execute(
        "INSERT INTO audit_log (actor_kind, actor, action, target, details, tenants)"
        " VALUES (%s, %s, %s, %s, %s, %s)",
        (actor.kind, actor.name, action, target, Jsonb(details or {}), sorted(set(tenants))),
    )


# Each row's tenants as a JSON array: unnest() of a text[][] would flatten it, and rows may
# have different numbers of tenants.
_TENANTS_OF = "ARRAY(SELECT jsonb_array_elements_text(tenants))"


def record_many(
    conn: psycopg.Connection[Any],
    actor: Actor,
    action: str,
    rows: list[tuple[str, dict[str, Any]]],
    *,
    tenants: list[list[str]] | None = None,
) -> None:
    """One row per (target, details) of ROWS, all by ACTOR doing ACTION, in one statement;
    TENANTS: each row's tenants (see `record`), in the order of ROWS; None: none."""
    if not rows:
        return
    each = _each_tenants(tenants, len(rows))
    conn.execute(
        "INSERT INTO audit_log (actor_kind, actor, action, target, details, tenants)"
        f" SELECT %s, %s, %s, target, details, {_TENANTS_OF}"
        " FROM unnest(%s::text[], %s::jsonb[], %s::jsonb[])"
        " WITH ORDINALITY AS r(target, details, tenants, n) ORDER BY n",
        (actor.kind, actor.name, action, [t for t, _ in rows], [Jsonb(d) for _, d in rows], each),
    )


def record_each(
    conn: psycopg.Connection[Any],
    action: str,
    rows: list[tuple[Actor, str, dict[str, Any]]],
    *,
    tenants: list[list[str]] | None = None,
) -> None:
    """One row per (actor, target, details) of ROWS, each doing ACTION, in one statement;
    TENANTS: each row's tenants (see `record`), in the order of ROWS; None: none."""
    if not rows:
        return
    conn.execute(
        "INSERT INTO audit_log (actor_kind, actor, action, target, details, tenants)"
        f" SELECT kind, name, %s, target, details, {_TENANTS_OF}"
        " FROM unnest(%s::text[], %s::text[], %s::text[], %s::jsonb[], %s::jsonb[])"
        " WITH ORDINALITY AS r(kind, name, target, details, tenants, n) ORDER BY n",
        (
            action,
            [a.kind for a, _, _ in rows],
            [a.name for a, _, _ in rows],
            [t for _, t, _ in rows],
            [Jsonb(d) for _, _, d in rows],
            _each_tenants(tenants, len(rows)),
        ),
    )


def _each_tenants(tenants: list[list[str]] | None, count: int) -> list[Jsonb]:
    if tenants is None:
        return [Jsonb([])] * count
    assert len(tenants) == count, "one list of tenants a row"
    return [Jsonb(sorted(set(t))) for t in tenants]


class ActorJson(TypedDict):
    kind: str
    name: str


class EntryJson(TypedDict):
    """An audit entry as the API answers it."""

    id: int
    time: str
    actor: ActorJson
    action: str
    target: str
    details: dict[str, Any]


@dataclass(frozen=True)
class Entry:
    id: int
    at: dt.datetime
    actor_kind: str
    actor: str
    action: str
    target: str
    details: dict[str, Any]

    def to_json(self) -> EntryJson:
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
        given = {
            "action": self.action,
            "target": self.target,
            "actor_kind": kind or None,
            "actor": name or None,
        }
        return {k: v for k, v in given.items() if v is not None}

    def where(self, scope: listing.Scope = None) -> listing.Where:
        """The WHERE clause naming only the filters given: each is then an index condition
        ((action, id), (target, id), (actor, id)), also in a prepared statement's generic
        plan, which `(%(x)s IS NULL OR ...)` would defeat. SCOPE (tenants; None: all):
        only rows all of whose tenants are among them. A row about several tenants (a
        person of acme and beta added, changed or signed in) names them all, so it is
        hidden from a person of only some of them, as `operator list` hides that person;
        rows about the cluster as a whole, which name no tenant, are for cluster-wide
        persons only. `&&` finds the rows (audit_log_tenants, GIN), `<@` drops the rest."""
        where = listing.Where()
        for column, value in self._params().items():
            where = where.equal(column, value)
        if scope is not None:
            where = where.also(
                "tenants && %(scope)s::text[] AND tenants <@ %(scope)s::text[]", scope=list(scope)
            )
        return where


def cursor(raw: str | None) -> int | None:
    """RAW as a `before` cursor (an entry id: ASCII digits that fit a bigint), else None."""
    if raw and raw.isascii() and raw.isdigit() and len(raw) <= 18:
        return int(raw)
    return None


def cursor_after(entry: Entry) -> str:
    """The opaque cursor of the page after one ending with ENTRY (what the API gives)."""
    return listing.encode({"id": entry.id})


def before_of(cursor: str) -> int:
    """The `before` id in an opaque cursor; listing.BadPaging if it is not one of ours."""
    return int(listing.decode(cursor, {"id": int})["id"])


def entries(
    conn: psycopg.Connection[Any],
    *,
    action: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    before: int | None = None,
    limit: int = 100,
    scope: listing.Scope = None,
) -> list[Entry]:
    """The newest LIMIT rows older than id BEFORE (keyset paging), newest first, filtered
    by exact ACTION, ACTOR (`ui:admin`, or `admin` of any kind) and TARGET, about SCOPE's
    tenants (None: every row)."""
    where = _before(Filters(action, actor, target).where(scope), before)
    rows = conn.execute(
        "SELECT id, at, actor_kind, actor, action, target, details FROM audit_log"
        + where.sql
        + " ORDER BY id DESC LIMIT %(limit)s",
        {**where.params, "limit": limit},
    ).fetchall()
    return [Entry(*row) for row in rows]


def _before(where: listing.Where, before: int | None) -> listing.Where:
    return where if before is None else where.also("id < %(before)s", before=before)


def entries_page(
    conn: psycopg.Connection[Any],
    filters: Filters,
    *,
    before: int | None,
    limit: int,
    scope: listing.Scope = None,
) -> tuple[list[Entry], str | None]:
    """One page of `entries` and the cursor of the next one (None: this is the last)."""
    rows = entries(
        conn, action=filters.action, actor=filters.actor, target=filters.target,
        before=before, limit=limit + 1, scope=scope,
    )  # fmt: skip
    if len(rows) <= limit:
        return rows, None
    return rows[:limit], cursor_after(rows[limit - 1])


# What Entry.to_json gives, as JSON text written by PostgreSQL with the keys of every
# object sorted as the API's encoder sorts them (oz0_sorted_json, migration 0012, for a
# nested value; a flat one is sorted here, without a function call a key).
_PAGE_JSON = (
    "SELECT json_build_object('action', action,"
    " 'actor', json_build_object('kind', actor_kind, 'name', actor),"
    " 'details', coalesce((SELECT json_object_agg(k, CASE WHEN jsonb_typeof(v) IN"
    "   ('object', 'array') THEN oz0_sorted_json(v) ELSE v::json END ORDER BY k COLLATE \"C\")"
    "   FROM jsonb_each(details) AS d (k, v)), '{}'::json),"
    f" 'id', id, 'target', target, 'time', {listing.iso_sql('at')})::text, id"
    " FROM audit_log"
)


def entries_page_json(
    conn: psycopg.Connection[Any],
    filters: Filters,
    *,
    before: int | None,
    limit: int,
    scope: listing.Scope = None,
) -> tuple[list[str], str | None]:
    """`entries_page`, each entry as the JSON text of its to_json(), for the API."""
    where = _before(filters.where(scope), before)
    rows = conn.execute(
        _PAGE_JSON + where.sql + " ORDER BY id DESC LIMIT %(limit)s",
        {**where.params, "limit": limit + 1},
    ).fetchall()
    if len(rows) <= limit:
        return [r[0] for r in rows], None
    return [r[0] for r in rows[:limit]], listing.encode({"id": rows[limit - 1][1]})


def newer_page(
    conn: psycopg.Connection[Any],
    filters: Filters,
    newest_shown: int,
    limit: int,
    *,
    scope: listing.Scope = None,
) -> int | None:
    """The `before` cursor of the page of LIMIT rows just newer than id NEWEST_SHOWN: None
    when there are none, 0 when that page is the first one (no cursor needed)."""
    where = filters.where(scope).also("id > %(after)s", after=newest_shown)
    rows = conn.execute(
        "SELECT id FROM audit_log" + where.sql + " ORDER BY id LIMIT %(n)s",
        {**where.params, "n": limit + 1},
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


# --- how long the log is kept (a cluster setting; the pruner deletes, oz0/jobs/pruner.py) --


def retention(conn: psycopg.Connection[Any]) -> int | None:
    """Seconds the audit log keeps a row; None: for ever (the default)."""
    row = conn.execute("SELECT audit_retention_s FROM cluster_settings").fetchone()
    return None if row is None or row[0] is None else int(row[0])


def set_retention(conn: psycopg.Connection[Any], seconds: int | None, actor: Actor) -> int | None:
    """Keep rows SECONDS (None: for ever); the change is itself a row (who, from what to
    what), never pruned before the new retention has passed. Returns the old retention."""
    row = conn.execute("SELECT audit_retention_s FROM cluster_settings FOR UPDATE").fetchone()
    before = None if row is None or row[0] is None else int(row[0])
    if before != seconds:
        conn.execute(
            "UPDATE cluster_settings SET audit_retention_s = %s, prune_due_at = now()",
            (seconds,),
        )
        record(
            conn, actor, "cluster.set", "cluster",
            {"audit_retention": {"from": describe(before), "to": describe(seconds)}},
        )  # fmt: skip
    return before
