"""Sessions' rows on a real PostgreSQL (oz0/node_sessions.py), no server running: a session
whose server stopped without ending it is ended by whichever server looks (`end_orphans`),
once, with its audit row, however many look at once; one whose server is up is left."""

from __future__ import annotations

import datetime as dt
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from oz0 import audit, node_sessions
from oz0.store import migrations

CLEAN = (*job_rows.CLEAN, "TRUNCATE sessions CASCADE")
SWEEPER = audit.Actor("server", "server-sweeper000")
DEAD = "server-dead00000000"


def open_session(conn: psycopg.Connection[Any], server: str, output_bytes: int = 0) -> str:
    session_id = "session-" + secrets.token_hex(8)
    node_sessions.create(
        conn, session_id, tenant="default", node_id="node-0123456789ab", person="alice",
        command=["sh"], header={"version": 2, "width": 80, "height": 24}, server=server,
        records_input=False,
    )  # fmt: skip
    # Opened a minute ago, before its server stopped.
    conn.execute(
        "UPDATE sessions SET started_at = now() - interval '1 minute' WHERE id = %s",
        (session_id,),
    )
    if output_bytes:
        node_sessions.add_chunk(conn, session_id, 1, b"sealed", 3, output_bytes)
    return session_id


def stop_server(conn: psycopg.Connection[Any], server: str, ago: dt.timedelta) -> None:
    """SERVER's row as a server killed AGO left it: its last heartbeat then."""
    conn.execute(
        "INSERT INTO servers (id, advertise, version, schema_version, last_heartbeat)"
        " VALUES (%s, '127.0.0.2', 'test', %s, now() - %s)",
        (server, migrations.code_version(), ago),
    )


@dataclass(frozen=True)
class End:
    target: str
    actor_kind: str
    actor: str
    details: dict[str, Any]
    tenants: list[str]


def ends(conn: psycopg.Connection[Any]) -> list[End]:
    rows = conn.execute(
        "SELECT target, actor_kind, actor, details, tenants FROM audit_log"
        " WHERE action = 'session.end' ORDER BY id"
    ).fetchall()
    return [End(*r) for r in rows]


def test_a_stopped_server_s_sessions_are_ended_with_their_audit_row_and_an_up_one_s_left(
    conn: psycopg.Connection[Any],
) -> None:
    stop_server(conn, DEAD, dt.timedelta(seconds=6))
    orphan = open_session(conn, DEAD, output_bytes=1234)
    # Its server's row gone (a stop that did not get to end it): ended at the look.
    gone = open_session(conn, "server-gone0000000")
    kept = open_session(conn, job_rows.SERVER)
    assert sorted(node_sessions.end_orphans(conn, SWEEPER)) == sorted([orphan, gone])
    ended = node_sessions.get(conn, orphan)
    assert (ended.live, ended.exit_code, ended.why) == (False, None, "its server stopped")
    assert ended.ended_at is not None
    # Ended when its server was last heard of, not when the sweep came.
    assert ended.ended_at < dt.datetime.now(dt.UTC) - dt.timedelta(seconds=5)
    [row] = [e for e in ends(conn) if e.target == orphan]
    assert (row.actor_kind, row.actor) == ("server", SWEEPER.name)
    assert row.tenants == ["default"]
    assert {k: row.details[k] for k in ("node", "person", "why", "server", "output_bytes")} == {
        "node": "node-0123456789ab",
        "person": "alice",
        "why": "its server stopped",
        "server": DEAD,
        "output_bytes": 1234,
    }
    assert node_sessions.get(conn, kept).live
    # Looked at again: nothing more, no second audit row.
    assert node_sessions.end_orphans(conn, SWEEPER) == []
    assert len(ends(conn)) == 2
    # The server relaying it, back after all, does not end it a second time.
    assert not node_sessions.finish(conn, orphan, 0, None)
    assert node_sessions.get(conn, orphan).why == "its server stopped"


def test_servers_that_look_at_once_end_a_session_once_and_none_waits(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    stop_server(conn, DEAD, dt.timedelta(seconds=10))
    orphan = open_session(conn, DEAD)
    main = one_cluster.main_db
    with psycopg.connect(main) as first, psycopg.connect(main, autocommit=True) as other:
        # The first has ended it and not yet committed; the second, looking meanwhile,
        # leaves it to the first (else it would wait on the first's lock here).
        assert node_sessions.end_orphans(first, SWEEPER) == [orphan]
        other.execute("SET lock_timeout = '2s'")
        assert node_sessions.end_orphans(other, SWEEPER) == []
        first.commit()
        assert node_sessions.end_orphans(other, SWEEPER) == []
    assert [e.target for e in ends(conn)] == [orphan]


def test_a_session_whose_row_a_frozen_server_holds_is_left_to_the_next_look(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    """A server frozen (SIGSTOP, a paused machine) in the middle of writing a chunk holds
    its session's row: the look ends the others, and that one once it is let go."""
    stop_server(conn, DEAD, dt.timedelta(seconds=10))
    held, free = open_session(conn, DEAD), open_session(conn, DEAD)
    main = one_cluster.main_db
    with psycopg.connect(main) as frozen:
        node_sessions.add_chunk(frozen, held, 7, b"sealed", 0, 10)
        conn.execute("SET lock_timeout = '2s'")
        assert node_sessions.end_orphans(conn, SWEEPER) == [free]
        frozen.rollback()
    assert node_sessions.end_orphans(conn, SWEEPER) == [held]
