"""Numbered SQL migrations of the `oz0` database."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Any

import psycopg

from oz0.errors import SchemaMismatch

_FILE_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load() -> list[Migration]:
    found = []
    for entry in resources.files("oz0.store").joinpath("migrations").iterdir():
        match = _FILE_NAME.fullmatch(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text(encoding="utf-8")))
    found.sort(key=lambda m: m.version)
    if [m.version for m in found] != list(range(1, len(found) + 1)):
        raise RuntimeError("migrations are not numbered 1, 2, 3, ... without gaps")
    return found


def code_version() -> int:
    return len(load())


def database_version(conn: psycopg.Connection[Any]) -> int:
    """The highest applied migration; 0 for a database we never touched."""
    exists = conn.execute("SELECT to_regclass('oz0_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM oz0_schema").fetchone()
    return int(row[0]) if row else 0


def apply(conn: psycopg.Connection[Any]) -> list[int]:
    """Apply what is missing, inside the caller's transaction; returns the versions applied."""
    conn.execute(
        "CREATE TABLE IF NOT EXISTS oz0_schema ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    # Two `server init --upgrade` at once must not both apply the same migration.
    conn.execute("LOCK TABLE oz0_schema IN EXCLUSIVE MODE")
    current = database_version(conn)
    check_not_newer(current)
    applied = []
    for migration in load():
        if migration.version > current:
            conn.execute(migration.sql.encode())
            conn.execute(
                "INSERT INTO oz0_schema (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration.version)
    return applied


def check_not_newer(found: int) -> None:
    if found > code_version():
        raise SchemaMismatch(
            f"database schema is at version {found}, newer than this orchestrator-zero "
            f"(it knows up to version {code_version()}); install the newer release"
        )


def check_current(conn: psycopg.Connection[Any]) -> None:
    """What `server start` requires: a schema exactly as new as the code."""
    found = database_version(conn)
    check_not_newer(found)
    if found == 0:
        raise SchemaMismatch("database holds no orchestrator-zero cluster; run `server init` first")
    if found < code_version():
        raise SchemaMismatch(
            f"database schema is at version {found}, this orchestrator-zero needs version "
            f"{code_version()}; run `orchestrator-zero server init --upgrade`"
        )
