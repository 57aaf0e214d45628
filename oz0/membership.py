"""Membership: each server keeps a row fresh; a server is up while its heartbeat is recent."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
import trio

from oz0 import __version__
from oz0.store import migrations
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL = 1.0
# Three missed heartbeats and a little slack for a slow database.
UP_WINDOW = dt.timedelta(seconds=5)
# Rows of servers gone this long are nobody's business any more.
FORGET_AFTER = dt.timedelta(days=1)


class ServerJson(TypedDict):
    """A server of the cluster as `cluster info` shows it."""

    id: str
    advertise: str
    started_at: str
    last_heartbeat: str
    temporal: str


@dataclass(frozen=True)
class ServerRow:
    id: str
    advertise: str
    started_at: dt.datetime
    last_heartbeat: dt.datetime
    temporal: str

    def to_json(self) -> ServerJson:
        return {
            "id": self.id,
            "advertise": self.advertise,
            "started_at": self.started_at.isoformat(),
            "last_heartbeat": self.last_heartbeat.isoformat(),
            "temporal": self.temporal,
        }


def servers_up(conn: psycopg.Connection[Any], window: dt.timedelta = UP_WINDOW) -> list[ServerRow]:
    """Servers whose last heartbeat is younger than WINDOW."""
    rows = conn.execute(
        "SELECT id, advertise, started_at, last_heartbeat, temporal_state FROM servers"
        " WHERE last_heartbeat > now() - %s ORDER BY advertise, id",
        (window,),
    ).fetchall()
    return [ServerRow(*r) for r in rows]


def live_schemas(
    conn: psycopg.Connection[Any], window: dt.timedelta = UP_WINDOW
) -> list[int | None]:
    """The schema of each server up (oz0/store/migrations.py): None for a server of a
    release before servers said theirs, or on a database that has no such column yet."""
    if not migrations.has_column(conn, "servers", "schema_version"):
        rows = conn.execute(
            "SELECT NULL FROM servers WHERE last_heartbeat > now() - %s", (window,)
        ).fetchall()
    else:
        rows = conn.execute(
            "SELECT schema_version FROM servers WHERE last_heartbeat > now() - %s", (window,)
        ).fetchall()
    return [r[0] for r in rows]


def all_up_at_least(conn: psycopg.Connection[Any], schema: int) -> bool:
    """Whether every server up is of a release at SCHEMA or later: what a feature that
    servers of an older release cannot run waits for during a rolling upgrade."""
    return all_at_least(live_schemas(conn), schema)


def all_at_least(schemas: list[int | None], schema: int) -> bool:
    """Whether every one of SCHEMAS (live_schemas's) is SCHEMA or later: a server that
    does not say its schema is of a release before any."""
    return all(s is not None and s >= schema for s in schemas)


@dataclass(frozen=True)
class ServerStatus:
    """A server's row as the Servers page shows it, up or not."""

    id: str
    advertise: str
    version: str
    started_at: dt.datetime
    last_heartbeat: dt.datetime
    temporal: str
    up: bool


def all_servers(
    conn: psycopg.Connection[Any], window: dt.timedelta = UP_WINDOW
) -> list[ServerStatus]:
    """Every server row (rows of servers gone FORGET_AFTER ago are removed at a start),
    up when its last heartbeat is younger than WINDOW: the same test as servers_up."""
    rows = conn.execute(
        "SELECT id, advertise, version, started_at, last_heartbeat, temporal_state,"
        " last_heartbeat > now() - %s FROM servers ORDER BY advertise, id",
        (window,),
    ).fetchall()
    return [ServerStatus(*r) for r in rows]


async def run(
    db: Database,
    server_id: str,
    advertise: str,
    *,
    interval: float = HEARTBEAT_INTERVAL,
    on_beat: Callable[[], None] = lambda: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Heartbeat every INTERVAL; on the way out, remove the row so others see us gone now.

    ON_BEAT is called after each heartbeat written (the first is the row's insert). The row
    says this server's schema, which a newer server starting reads before it applies a
    contract migration (oz0/store/migrations.py)."""
    schema = migrations.code_version()

    def register(conn: psycopg.Connection[Any]) -> None:
        # Not on a database a newer server has contracted since this one's start checked it.
        migrations.admit(conn, schema)
        conn.execute(
            "INSERT INTO servers (id, advertise, version, schema_version) VALUES (%s, %s, %s, %s)"
            " ON CONFLICT (id) DO UPDATE SET last_heartbeat = clock_timestamp()",
            (server_id, advertise, __version__, schema),
        )
        conn.execute("DELETE FROM servers WHERE last_heartbeat < now() - %s", (FORGET_AFTER,))

    def beat(conn: psycopg.Connection[Any]) -> None:
        beaten = conn.execute(
            "UPDATE servers SET last_heartbeat = clock_timestamp() WHERE id = %s", (server_id,)
        ).rowcount
        if not beaten:  # forgotten meanwhile (after a database outage): in again, as at start
            register(conn)

    def leave(conn: psycopg.Connection[Any]) -> None:
        conn.execute("DELETE FROM servers WHERE id = %s", (server_id,))

    await db.transaction(register)
    on_beat()
    task_status.started()
    outage = Outage("membership heartbeat", log)
    try:
        while True:
            await trio.sleep(interval)
            try:
                await db.transaction(beat)
            except DATABASE_ERRORS as e:
                # Not fatal: while beats fail this server simply ages out of "up", and it
                # keeps beating every INTERVAL so it is back as soon as the database is.
                outage.failed(e)
                continue
            outage.worked()
            on_beat()
    finally:
        with trio.CancelScope(shield=True) as scope:
            scope.deadline = trio.current_time() + 2
            try:
                await db.transaction(leave)
            except psycopg.Error as e:
                log.warning("could not remove this server's membership row: %s", e)
