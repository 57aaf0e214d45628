"""Creating, checking and dropping the cluster's three databases."""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import sql

from oz0.errors import Oz0Error
from oz0.store.dburl import DatabaseUrl

MIN_VERSION, MAX_VERSION = 13, 16
# Where a connection can be made before our databases exist.
_MAINTENANCE_DATABASES = ("postgres", "template1")


def connect(conninfo: str, **kwargs: Any) -> psycopg.Connection[Any]:
    try:
        return psycopg.connect(conninfo, connect_timeout=10, **kwargs)
    except psycopg.OperationalError as e:
        first_line = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise Oz0Error(f"cannot connect to PostgreSQL: {first_line}") from None


def check_server_version(conn: psycopg.Connection[Any]) -> int:
    """Refuse PostgreSQL outside 13 to 16, naming the version found."""
    major = conn.info.server_version // 10000
    if not MIN_VERSION <= major <= MAX_VERSION:
        shown = conn.execute("SHOW server_version").fetchone()
        raise Oz0Error(
            f"PostgreSQL {shown[0] if shown else major} is not supported; "
            f"orchestrator-zero needs PostgreSQL {MIN_VERSION} to {MAX_VERSION}"
        )
    return major


def maintenance_connection(url: DatabaseUrl) -> psycopg.Connection[Any]:
    """An autocommit connection to a database other than ours, for CREATE/DROP DATABASE."""
    last: Oz0Error | None = None
    for dbname in (*_MAINTENANCE_DATABASES, url.names.main):
        try:
            return connect(url.for_database(dbname), autocommit=True)
        except Oz0Error as e:
            last = e
    assert last is not None
    raise last


def existing(conn: psycopg.Connection[Any], names: tuple[str, ...]) -> set[str]:
    rows = conn.execute(
        "SELECT datname FROM pg_database WHERE datname = ANY(%s)", (list(names),)
    ).fetchall()
    return {r[0] for r in rows}


def may_create_databases(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
    ).fetchone()
    return bool(row and row[0])


def create(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(
        sql.SQL("CREATE DATABASE {} ENCODING 'UTF8' TEMPLATE template0").format(
            sql.Identifier(name)
        )
    )


def drop(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {}").format(sql.Identifier(name)))


def user_tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT schemaname || '.' || tablename FROM pg_tables"
        " WHERE schemaname NOT IN ('pg_catalog', 'information_schema') ORDER BY 1 LIMIT 5"
    ).fetchall()
    return [r[0] for r in rows]
