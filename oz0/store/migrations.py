"""Numbered SQL migrations of the `oz0` database, and which servers may run beside them.

Servers of two releases run side by side on one database during a rolling upgrade
(docs/run-a-cluster.md, "Upgrade a cluster"). A server's *schema* is the highest migration
it knows; the database's is the highest applied. Each migration is one of two kinds,
declared by its first line:

- **expand** (no header, or `-- oz0: expand`): servers that do not know it keep running
  beside it. New tables, nullable or defaulted columns, new indexes, wider checks.
- **contract** (`-- oz0: contract`): servers that do not know it cannot run beside it.
  Drops of what older code reads or writes, renames, NOT NULL or new constraints on
  existing columns, a changed meaning (a notification's payload). Its release's code must
  not need it: a contract step removes what that code no longer uses, so it can wait.

The database keeps what an older server needs to decide for itself: `oz0_schema` (one row
per applied migration) has `oldest_server`, the oldest server schema that may run once that
migration is applied (the highest contract migration up to it); the database's floor is the
highest of them. Each server's row in `servers` says its schema (`schema_version`; null for
a server of a release before this rule). These two columns are this module's bookkeeping,
as `oz0_schema` itself is, not a numbered migration's: they must exist before any numbered
migration is judged.

The rule, at `server start`, `server init --upgrade` and `--dev` alike (`plan`):

- database schema = the server's: it runs.
- database schema newer: the server runs if the floor <= its schema; else it refuses,
  naming both ("upgrade it").
- database schema older: the server migrates, in order. An expand step is applied at once,
  whoever is live. A contract step is applied only when no live server (heartbeat within
  membership's window) is older than it; a live server that does not say its schema counts
  as older than any. While one is, the contract step and everything after it wait (the next
  start or `server init --upgrade` with no older server live applies them) and the server
  runs without them, which only contract steps may be: an expand step behind a waiting
  contract step refuses the start instead. A database older than MIGRATES_FROM is refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import psycopg

from oz0.errors import SchemaMismatch

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_HEADER = re.compile(r"^-- oz0: (expand|contract)$")
# The oldest database schema this release migrates from: every one since the first release.
# A release that drops the steps from some old schema raises it.
MIGRATES_FROM = 1


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str
    # Servers that do not know this migration cannot run beside it (module docstring).
    contract: bool = False


def kind_of(sql: str, name: str = "migration") -> bool:
    """Whether SQL declares a contract migration; raises on a header it cannot read, so a
    typo ("-- oz0: contact") is not taken for the default."""
    first = sql.split("\n", 1)[0].rstrip()
    if _HEADER.fullmatch(first):
        return first.endswith("contract")
    for line in sql.splitlines():
        if line.startswith("-- oz0:"):
            raise RuntimeError(
                f"{name}: '{line}' is not a header; the first line may be "
                "'-- oz0: expand' or '-- oz0: contract'"
            )
    return False


def load() -> list[Migration]:
    found = []
    for entry in resources.files("oz0.store").joinpath("migrations").iterdir():
        match = _FILE_NAME.fullmatch(entry.name)
        if match:
            sql = entry.read_text(encoding="utf-8")
            found.append(Migration(int(match[1]), match[2], sql, kind_of(sql, entry.name)))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError("migrations are not numbered 1, 2, 3, ... without gaps")
    return found


def code_version() -> int:
    return len(load())


def floor_at(version: int, known: Sequence[Migration]) -> int:
    """The oldest server schema that may run on a database at VERSION: its highest contract
    migration (1, the first schema, when it has none)."""
    return max((m.version for m in known if m.contract and m.version <= version), default=1)


def database_version(conn: psycopg.Connection[Any]) -> int:
    """The highest applied migration; 0 for a database we never touched."""
    exists = conn.execute("SELECT to_regclass('oz0_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM oz0_schema").fetchone()
    return int(row[0]) if row else 0


def has_column(conn: psycopg.Connection[Any], table: str, column: str) -> bool:
    row = conn.execute(
        "SELECT EXISTS (SELECT FROM information_schema.columns"
        " WHERE table_schema = current_schema() AND table_name = %s AND column_name = %s)",
        (table, column),
    ).fetchone()
    return bool(row and row[0])


def database_floor(conn: psycopg.Connection[Any]) -> int:
    """The oldest server schema that may run on this database. A database no server with
    this rule has touched has no record: then only a server of its own schema or newer."""
    if not has_column(conn, "oz0_schema", "oldest_server"):
        return database_version(conn)
    row = conn.execute("SELECT max(oldest_server), max(version) FROM oz0_schema").fetchone()
    if row is None or row[0] is None:
        return database_version(conn)
    return int(row[0])


@dataclass(frozen=True)
class Plan:
    """What a server does to a database: migrations to apply now, contract ones that wait
    for older servers to leave (the server runs without them)."""

    apply: list[Migration] = field(default_factory=list)
    waiting: list[Migration] = field(default_factory=list)


def plan(found: int, floor: int, live: Sequence[int | None], known: Sequence[Migration]) -> Plan:
    """The rule of the module docstring: FOUND is the database's schema, FLOOR its oldest
    server schema, LIVE the schemas of the servers up now (None: one before this rule)."""
    code = known[-1].version if known else 0
    if found == 0:
        raise SchemaMismatch("database holds no orchestrator-zero cluster; run `server init` first")
    if found >= code:
        if floor > code:
            raise _too_old_for(found, floor, code)
        return Plan()
    if found < MIGRATES_FROM:
        raise SchemaMismatch(
            f"database schema {found} is older than this release migrates from (schema "
            f"{MIGRATES_FROM}); upgrade it with an earlier release first, then with this one"
        )
    pending = [m for m in known if m.version > found]
    oldest_live = min((s or 0 for s in live), default=None)
    for i, migration in enumerate(pending):
        if migration.contract and oldest_live is not None and oldest_live < migration.version:
            waiting = pending[i:]
            needed = next((m for m in waiting if not m.contract), None)
            if needed is not None:
                older = f"schema {oldest_live}" if oldest_live else "an earlier release"
                raise SchemaMismatch(
                    f"database schema {found}: migration {needed.version} waits behind "
                    f"contract migration {migration.version}, which servers of {older} still "
                    "running cannot run beside; upgrade them first"
                )
            return Plan(pending[:i], waiting)
    return Plan(pending)


Live = Sequence[int | None] | Callable[[psycopg.Connection[Any]], Sequence[int | None]]


def apply(conn: psycopg.Connection[Any], live: Live = ()) -> Plan:
    """Apply what the rule allows, inside the caller's transaction, beside servers of the
    LIVE schemas (or what LIVE(conn) reads, once the migrations' lock is held: a server
    registering meanwhile is then either seen or refused, see `admit`); a database never
    touched gets every migration. Raises SchemaMismatch, having written nothing, when this
    server may not run on the database."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS oz0_schema ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    # Two servers starting at once (or `server init --upgrade`) must not both apply the
    # same migration: the second waits here, then finds it applied.
    conn.execute("LOCK TABLE oz0_schema IN EXCLUSIVE MODE")
    known = load()
    current = database_version(conn)
    if callable(live):
        live = live(conn) if current else ()
    steps = Plan(known) if current == 0 else plan(current, database_floor(conn), live, known)
    if current > known[-1].version:
        return steps  # a newer server keeps the books
    for migration in steps.apply:
        conn.execute(migration.sql.encode())
        conn.execute(
            "INSERT INTO oz0_schema (version, name) VALUES (%s, %s)",
            (migration.version, migration.name),
        )
    _keep_books(conn, known)
    return steps


def _keep_books(conn: psycopg.Connection[Any], known: Sequence[Migration]) -> None:
    """Add the rule's two columns where missing (a database last migrated by a release
    before the rule), and each applied migration's floor."""
    if not has_column(conn, "oz0_schema", "oldest_server"):
        conn.execute("ALTER TABLE oz0_schema ADD COLUMN oldest_server integer")
    if not has_column(conn, "servers", "schema_version"):
        # Nullable: servers of earlier releases go on inserting their rows without it.
        conn.execute("ALTER TABLE servers ADD COLUMN schema_version integer")
    for (version,) in conn.execute(
        "SELECT version FROM oz0_schema WHERE oldest_server IS NULL"
    ).fetchall():
        conn.execute(
            "UPDATE oz0_schema SET oldest_server = %s WHERE version = %s",
            (floor_at(version, known), version),
        )


def admit(conn: psycopg.Connection[Any], schema: int) -> None:
    """Before a server of SCHEMA writes its row in `servers`, in that transaction: the
    database must still be one it may run beside. Its lock (SHARE) and a migration's
    (EXCLUSIVE) exclude each other, and `apply` reads the live servers under its own: so a
    contract migration and the registration of a server it would leave behind cannot cross
    (a server checks the schema at its start, seconds before it registers). Raises
    SchemaMismatch."""
    conn.execute("LOCK TABLE oz0_schema IN SHARE MODE")
    floor = database_floor(conn)
    if floor > schema:
        raise _too_old_for(database_version(conn), floor, schema)


def _too_old_for(found: int, floor: int, code: int) -> SchemaMismatch:
    """A server of schema CODE on a database of schema FOUND, whose floor is FLOOR."""
    return SchemaMismatch(
        f"database schema {found} needs servers of schema {floor} or newer; "
        f"this server knows {code}: upgrade it"
    )


def check_current(conn: psycopg.Connection[Any]) -> None:
    """What a command that uses the database without migrating it requires (`server
    operator issue`, `server ui-password`): a schema this code may run beside, all of its
    own migrations applied but contract ones."""
    known = load()
    found = database_version(conn)
    steps = plan(found, database_floor(conn), (), known)
    needed = [m.version for m in steps.apply if not m.contract]
    if needed:
        raise SchemaMismatch(
            f"database schema {found} is older than this release's {known[-1].version}; "
            "start a server of this release (it migrates) or run "
            "`orchestrator-zero server init --upgrade`"
        )
