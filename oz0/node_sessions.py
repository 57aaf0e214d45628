"""Sessions' records (docs/sessions.md): who opened which on what node, when, how it ended,
and its recording, an asciicast v2 file (https://docs.asciinema.org/manual/asciicast/v2/)
kept as the header (a column of its row) and chunks of event lines.

Each chunk is sealed with the cluster's master key as pki.Sealed.SESSION, bound to the
session's ID and the chunk's number: a chunk cannot be moved to stand in another session
or another place. Reading a session's content (`recording`) is an admin's; that it
happened (`Session`) the viewers' of its tenant too.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from oz0 import audit, listing, membership, pki
from oz0.errors import Oz0Error
from oz0.json_values import iso

Conn = psycopg.Connection[Any]

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
# Chunks of a recording read from the database at once.
CHUNKS_AT_ONCE = 64
# Why a session ended whose server stopped before it could say (`end_orphans`).
SERVER_STOPPED = "its server stopped"


class SessionNotFound(Oz0Error):
    pass


class SettingsJson(TypedDict):
    """The cluster's session settings as `cluster info` shows them."""

    session_record_input: bool
    session_idle_timeout_seconds: int
    session_max_seconds: int


@dataclass(frozen=True)
class Settings:
    """The cluster's settings for sessions (cluster_settings.session_*)."""

    record_input: bool = False
    idle_timeout: float = 900.0
    max_length: float = 8 * 3600.0

    @classmethod
    def read(cls, conn: Conn) -> Settings:
        row = conn.execute(
            "SELECT session_record_input, session_idle_timeout_s, session_max_s"
            " FROM cluster_settings"
        ).fetchone()
        if row is None:
            return cls()
        return cls(bool(row[0]), float(row[1]), float(row[2]))

    def to_json(self) -> SettingsJson:
        return {
            "session_record_input": self.record_input,
            "session_idle_timeout_seconds": int(self.idle_timeout),
            "session_max_seconds": int(self.max_length),
        }


def set_settings(conn: Conn, changes: dict[str, Any]) -> dict[str, Any]:
    """Change the settings CHANGES names (record_input, idle_timeout_s, max_s); what they
    were, by name, for the audit row."""
    before = Settings.read(conn)
    was = {
        "record_input": before.record_input,
        "idle_timeout_s": int(before.idle_timeout),
        "max_s": int(before.max_length),
    }
    for name, value in changes.items():
        conn.execute(
            f"UPDATE cluster_settings SET session_{name} = %s",
            (value,),
        )
    return {name: {"from": was[name], "to": value} for name, value in changes.items()}


class SessionJson(TypedDict):
    """A session's record as the API answers it (not what it showed)."""

    id: str
    tenant: str
    node: str
    person: str
    command: list[str]
    width: int | None
    height: int | None
    server: str
    records_input: bool
    started_at: str
    ended_at: str | None
    live: bool
    exit_code: int | None
    why: str | None
    input_bytes: int
    output_bytes: int
    user: str | None


@dataclass(frozen=True)
class Session:
    id: str
    tenant: str
    node_id: str
    person: str
    command: list[str]
    header: dict[str, Any]
    server: str
    records_input: bool
    started_at: dt.datetime
    ended_at: dt.datetime | None
    exit_code: int | None
    why: str | None
    input_bytes: int
    output_bytes: int
    # The account it ran as (`--user`); None: a UID of its own, or the agent's user.
    run_as: str | None
    # Whether the server that relays it is up: one killed leaves its sessions unended
    # until another ends them in the records (`end_orphans`, seconds later), over all
    # the same meanwhile (its node ended them with its stream).
    server_up: bool = True

    @property
    def live(self) -> bool:
        return self.ended_at is None and self.server_up

    @property
    def ending(self) -> str | None:
        """Why it ended, if it did without an exit code."""
        if self.ended_at is None and not self.server_up:
            return SERVER_STOPPED
        return self.why

    def to_json(self) -> SessionJson:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "node": self.node_id,
            "person": self.person,
            "command": self.command,
            "width": self.header.get("width"),
            "height": self.header.get("height"),
            "server": self.server,
            "records_input": self.records_input,
            "started_at": self.started_at.isoformat(),
            "ended_at": iso(self.ended_at),
            "live": self.live,
            "exit_code": self.exit_code,
            "why": self.ending,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "user": self.run_as,
        }


# The last: whether its server is up (membership.UP_WINDOW, as `cluster info` counts them).
_COLUMNS = (
    "id, tenant, node_id, person, command, header, server, records_input, started_at,"
    " ended_at, exit_code, why, input_bytes, output_bytes, run_as,"
    " EXISTS (SELECT 1 FROM servers WHERE servers.id = sessions.server"
    " AND last_heartbeat > now() - interval '5 seconds')"
)


def create(
    conn: Conn,
    session_id: str,
    *,
    tenant: str,
    node_id: str,
    person: str,
    command: list[str],
    header: dict[str, Any],
    server: str,
    records_input: bool,
    run_as: str | None = None,
) -> None:
    conn.execute(
        "INSERT INTO sessions (id, tenant, node_id, person, command, header, server,"
        " records_input, run_as) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (session_id, tenant, node_id, person, Jsonb(command), Jsonb(header), server,
         records_input, run_as),
    )  # fmt: skip


def add_chunk(
    conn: Conn, session_id: str, seq: int, sealed: bytes, input_bytes: int, output_bytes: int
) -> None:
    """Chunk SEQ of the session's recording, and its counts of bytes as they are now."""
    conn.execute(
        "INSERT INTO session_chunks (session_id, seq, sealed) VALUES (%s, %s, %s)",
        (session_id, seq, sealed),
    )
    conn.execute(
        "UPDATE sessions SET input_bytes = %s, output_bytes = %s WHERE id = %s",
        (input_bytes, output_bytes, session_id),
    )


def finish(conn: Conn, session_id: str, exit_code: int | None, why: str | None) -> bool:
    """The session's end, as the server relaying it saw it; False if it was ended before
    (by another server, `end_orphans`, while this one was taken for stopped)."""
    return bool(
        conn.execute(
            "UPDATE sessions SET ended_at = now(), exit_code = %s, why = %s"
            " WHERE id = %s AND ended_at IS NULL",
            (exit_code, why, session_id),
        ).rowcount
    )


def end_orphans(conn: Conn, actor: audit.Actor) -> list[str]:
    """End, in the records, the sessions whose server is not up (membership.UP_WINDOW):
    killed, or stopped without ending them. Its node ended them with its stream; their
    recording is as it was written. Each gets its `session.end` audit row by ACTOR (the
    server noticing), with the bytes as recorded; ended at the server's last heartbeat
    when its row is still there (else now). Their IDs.

    Idempotent among servers noticing at once, and never waiting: a row another
    transaction holds (another server ending it, or the stopped server's last write, if
    it was frozen in the middle of one) is left to the next look."""
    rows = conn.execute(
        "UPDATE sessions SET ended_at = greatest(started_at, coalesce((SELECT last_heartbeat"
        "  FROM servers WHERE servers.id = sessions.server), now())), why = %(why)s"
        " WHERE id IN (SELECT id FROM sessions WHERE ended_at IS NULL AND NOT EXISTS"
        "  (SELECT 1 FROM servers WHERE servers.id = sessions.server"
        "  AND last_heartbeat > now() - %(up)s) FOR UPDATE SKIP LOCKED)"
        " AND ended_at IS NULL"
        " RETURNING id, tenant, node_id, person, command, server,"
        "  extract(epoch FROM ended_at - started_at), input_bytes, output_bytes",
        {"why": SERVER_STOPPED, "up": membership.UP_WINDOW},
    ).fetchall()
    ended = []
    for session_id, tenant, node_id, person, command, server, took, ins, outs in rows:
        details = {
            "node": node_id, "command": command, "person": person, "exit_code": None,
            "why": SERVER_STOPPED, "server": server, "seconds": round(float(took), 3),
            "input_bytes": ins, "output_bytes": outs,
        }  # fmt: skip
        audit.record(conn, actor, "session.end", session_id, details, tenants=[tenant])
        ended.append(str(session_id))
    return ended


def get(conn: Conn, session_id: str, *, scope: listing.Scope = None) -> Session:
    where = listing.Where().also("id = %(id)s", id=session_id).within("tenant", scope)
    row = conn.execute(f"SELECT {_COLUMNS} FROM sessions" + where.sql, where.params).fetchone()
    if row is None:
        raise SessionNotFound(f"session {session_id} not found")
    return Session(*row)


def page(
    conn: Conn,
    *,
    scope: listing.Scope = None,
    node_id: str | None = None,
    person: str | None = None,
    live: bool = False,
    limit: int = DEFAULT_LIMIT,
) -> list[Session]:
    """The newest sessions first, LIMIT at most."""
    where = (
        listing.Where().equal("node_id", node_id).equal("person", person).within("tenant", scope)
    )
    if live:
        where = where.also(
            "ended_at IS NULL AND server IN (SELECT id FROM servers"
            " WHERE last_heartbeat > now() - interval '5 seconds')"
        )
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM sessions{where.sql} ORDER BY started_at DESC, id DESC"
        " LIMIT %(limit)s",
        {**where.params, "limit": limit},
    ).fetchall()
    return [Session(*r) for r in rows]


def seal_chunk(master_key: bytes, cluster: str, session_id: str, seq: int, text: str) -> bytes:
    return pki.seal(
        master_key, text.encode(), cluster, pki.Sealed.SESSION, bound=(session_id, str(seq))
    )


def recording(
    conn: Conn, master_key: bytes, cluster: str, session: Session
) -> Generator[str, None, None]:
    """SESSION's asciicast v2 file, line by line: its header, then its events as recorded."""
    yield json.dumps(session.header) + "\n"
    # A cursor of the server's, read a few chunks at a time: a reader that stops early
    # (the web UI's replay, oz0/web/terminal_frames.py) does not load the rest.
    with conn.cursor(name=f"recording-{session.id}") as rows:
        rows.itersize = CHUNKS_AT_ONCE
        rows.execute(
            "SELECT seq, sealed FROM session_chunks WHERE session_id = %s ORDER BY seq",
            (session.id,),
        )
        for seq, sealed in rows:
            yield pki.unseal(
                master_key, bytes(sealed), cluster, pki.Sealed.SESSION,
                bound=(session.id, str(seq)),
            ).decode()  # fmt: skip
