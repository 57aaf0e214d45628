"""Before the pool lends a connection (oz0/store/pool.py, `check_if_spoken_to`): one that
the database ended is replaced before use, a healthy idle one is lent without a round trip.
Against the real PostgreSQL of the suite."""

from __future__ import annotations

import threading
from functools import partial
from typing import Any

import psycopg
import psycopg.errors
import pytest
import trio
from psycopg_pool import ConnectionPool

from fixtures.postgres import admin_url
from oz0.store.pool import Conn, open_database


def backend(conn: Conn) -> int:
    return conn.info.backend_pid


@pytest.fixture
def asked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The backends of the connections the pool asks with a round trip, in order."""
    pids: list[int] = []
    real = ConnectionPool.check_connection

    def counted(conn: Any) -> None:
        pids.append(conn.info.backend_pid)
        real(conn)

    monkeypatch.setattr(ConnectionPool, "check_connection", staticmethod(counted))
    return pids


def ended_the_first_time(ran: list[int], conn: Conn) -> int:
    """A work whose connection the database ends under it the first time it runs (RAN
    collects the backend of each run); its backend."""
    ran.append(conn.info.backend_pid)
    if len(ran) == 1:
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
    return conn.info.backend_pid


async def test_an_ended_connection_is_replaced_and_a_healthy_one_is_not_asked(
    asked: list[int],
) -> None:
    async with open_database(admin_url(), min_size=1, max_size=1) as db:
        first = await db.transaction(backend)
        assert await db.transaction(backend) == first
        assert asked == [], "a healthy idle connection was asked with a round trip"
        with psycopg.connect(admin_url(), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (first,))
        await trio.sleep(0.5)  # the server's last words reach the socket
        replaced = await db.transaction(backend)
    assert replaced != first
    assert asked == [first], "the ended connection was not asked before use"


async def test_a_connection_ended_while_its_work_runs_is_replaced_and_the_work_run_again() -> None:
    """Ended before its commit, so nothing of it was written: as if lent just after the
    database ended it, before it could say so."""
    ran: list[int] = []
    dies_the_first_time = partial(ended_the_first_time, ran)

    async with open_database(admin_url(), min_size=1, max_size=1) as db:
        answered = await db.transaction(dies_the_first_time)
    assert len(ran) == 2 and ran[0] != ran[1] == answered


async def test_after_a_connection_ends_under_its_work_every_idle_one_is_asked_first(
    asked: list[int],
) -> None:
    # Whatever ended it (a restart, a kill of every session) may have ended the idle ones
    # too, a moment ago, before they could say so: the one more try must not get them.
    ran: list[int] = []
    dies_the_first_time = partial(ended_the_first_time, ran)

    async with open_database(admin_url(), min_size=2, max_size=2) as db:
        async with trio.open_nursery() as nursery:
            # Both connections made and idle: two works hold them at once.
            held = threading.Event()
            for _ in range(2):
                nursery.start_soon(db.transaction, lambda conn: held.wait(5))
            await trio.sleep(0.5)
            held.set()
        idle = set()
        for _ in range(4):
            idle.add(await db.transaction(backend))
        assert len(idle) == 2 and asked == []
        answered = await db.transaction(dies_the_first_time)
    assert ran[1] == answered and ran[0] != answered
    assert set(asked) >= idle - {ran[0]}, "an idle connection was lent unasked after a loss"


async def test_a_work_whose_connection_ends_twice_fails_and_other_errors_are_not_retried() -> None:
    ran: list[str] = []

    def always_dies(conn: Conn) -> None:
        ran.append("dies")
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    def fails(conn: Conn) -> None:
        ran.append("fails")
        conn.execute("SELECT 1 / 0")

    async with open_database(admin_url(), min_size=1, max_size=1) as db:
        with pytest.raises(psycopg.OperationalError):
            await db.transaction(always_dies)
        assert ran == ["dies", "dies"]
        with pytest.raises(psycopg.errors.DivisionByZero):
            await db.transaction(fails)
        assert ran == ["dies", "dies", "fails"]
        assert await db.transaction(backend) > 0  # and the pool is whole
