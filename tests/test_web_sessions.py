"""Web UI sessions end on their own: after IDLE (30 minutes) without a request, or ABSOLUTE
(12 hours) after the sign-in. Time moves through the rows (`last_seen`, `created_at`),
which is all the product reads; no server runs here."""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg

from oz0 import ui_sessions as sessions

SOURCE = "192.0.2.1"
SECOND = dt.timedelta(seconds=1)
# What the docs promise (docs/run-a-cluster.md), written out: not read from the module.
IDLE = dt.timedelta(minutes=30)
ABSOLUTE = dt.timedelta(hours=12)


CLEAN = ("DELETE FROM ui_sessions",)


def started(conn: psycopg.Connection[Any]) -> str:
    token, _ = sessions.start(conn, "admin", SOURCE)
    return token


def age(conn: psycopg.Connection[Any], token: str, **columns: dt.timedelta) -> None:
    """Move the session's clocks back: COLUMNS (last_seen, created_at) are now - AGE."""
    for column, ago in columns.items():
        assert column in ("last_seen", "created_at")
        conn.execute(
            f"UPDATE ui_sessions SET {column} = now() - %s WHERE token_sha256 = %s",
            (ago, sessions._digest(token)),
        )


def test_a_session_idle_for_more_than_30_minutes_has_ended_on_every_server(
    conn: psycopg.Connection[Any],
) -> None:
    token = started(conn)
    age(conn, token, last_seen=IDLE + SECOND)
    assert sessions.current(conn, token) is None
    assert sessions.count_open(conn, "admin") == 0


def test_a_request_within_30_minutes_starts_the_idle_clock_again(
    conn: psycopg.Connection[Any],
) -> None:
    token = started(conn)
    age(conn, token, last_seen=IDLE - dt.timedelta(minutes=1))
    assert sessions.count_open(conn, "admin") == 1
    current = sessions.current(conn, token)
    assert current is not None and current.username == "admin"
    # That request was seen now: another 29 minutes later, the session still holds.
    row = conn.execute(
        "SELECT now() - last_seen FROM ui_sessions WHERE token_sha256 = %s",
        (sessions._digest(token),),
    ).fetchone()
    assert row is not None and row[0] < dt.timedelta(minutes=1)


def test_a_session_ends_12_hours_after_its_sign_in_however_busy(
    conn: psycopg.Connection[Any],
) -> None:
    token = started(conn)
    age(conn, token, created_at=ABSOLUTE - dt.timedelta(minutes=1))
    assert sessions.current(conn, token) is not None
    age(conn, token, created_at=ABSOLUTE + SECOND)
    assert sessions.current(conn, token) is None
    assert sessions.count_open(conn, "admin") == 0


def test_sign_out_clears_expired_sessions_of_everyone(conn: psycopg.Connection[Any]) -> None:
    idle, fresh = started(conn), started(conn)
    age(conn, idle, last_seen=IDLE + SECOND)
    sessions.end(conn, None)
    assert conn.execute("SELECT count(*) FROM ui_sessions").fetchone() == (1,)
    assert sessions.current(conn, fresh) is not None


def test_a_look_without_touching_leaves_the_idle_clock_alone(
    conn: psycopg.Connection[Any],
) -> None:
    token = started(conn)
    age(conn, token, last_seen=IDLE - dt.timedelta(minutes=5))
    looked = sessions.current(conn, token, touch=False)
    assert looked is not None and looked.username == "admin"
    row = conn.execute(
        "SELECT now() - last_seen FROM ui_sessions WHERE token_sha256 = %s",
        (sessions._digest(token),),
    ).fetchone()
    assert row is not None and row[0] >= IDLE - dt.timedelta(minutes=5)


def test_one_query_finds_which_sessions_go_on(conn: psycopg.Connection[Any]) -> None:
    going, signed_out, idle = started(conn), started(conn), started(conn)
    sessions.end(conn, signed_out)
    age(conn, idle, last_seen=IDLE + SECOND)
    asked = {going, signed_out, idle, "never-a-session"}
    assert sessions.open_among(conn, asked).keys() == {going}
    # Its operator removed, the account's sessions end with it.
    with conn.transaction(force_rollback=True):
        conn.execute("DELETE FROM operators WHERE name = 'admin'")
        assert sessions.open_among(conn, asked) == {}
