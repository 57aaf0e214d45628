"""The database pool under a crowd (issue 13, goal 5): queries of a crowd that shares the
pool (`Database.sharing`, the edge's, thousands at once in a reconnect storm) take at most
their share of its connections, and a database with threads of its own (the membership
heartbeat's) never waits behind the worker threads everyone else fills. Against the real
PostgreSQL of the suite."""

from __future__ import annotations

import threading
from typing import Any

import trio

from fixtures.polling import trio_until
from fixtures.postgres import admin_url
from oz0.store.pool import Conn, open_database

CROWD = 50
SHARE = 3
POOL = 6


def held_until(release: threading.Event) -> Any:
    def work(conn: Conn) -> None:
        conn.execute("SELECT 1")
        release.wait(20)

    return work


def answer(conn: Conn) -> int:
    row = conn.execute("SELECT 2").fetchone()
    assert row is not None
    return int(row[0])


async def test_a_crowd_sharing_the_pool_leaves_the_rest_of_it_to_others() -> None:
    release = threading.Event()
    async with open_database(admin_url(), min_size=0, max_size=POOL) as db:
        crowd = db.sharing(SHARE)
        try:
            async with trio.open_nursery() as nursery:
                for _ in range(CROWD):
                    nursery.start_soon(crowd.transaction, held_until(release))
                # Polled: the pool and Trio's limiter announce nothing to wait on.
                await trio_until(
                    lambda: db.use().in_use >= SHARE, 10, "the crowd holds its share", step=0.05
                )
                await trio.sleep(0.3)
                # The crowd holds its share and no more, however many of it wait...
                assert db.use().in_use == SHARE
                # ...so a query of someone else is answered at once, not after the crowd.
                with trio.fail_after(3):
                    assert await db.transaction(answer) == 2
                release.set()
        finally:
            release.set()


async def test_a_database_with_its_own_threads_does_not_wait_for_the_shared_ones() -> None:
    release = threading.Event()
    limiter = trio.to_thread.current_default_thread_limiter()
    async with open_database(admin_url(), min_size=1, max_size=1, own_threads=True) as own:
        try:
            async with trio.open_nursery() as nursery:
                # Every one of Trio's shared worker threads busy, more calls waiting.
                for _ in range(int(limiter.total_tokens) + 5):
                    nursery.start_soon(trio.to_thread.run_sync, release.wait, 20)
                await trio_until(
                    lambda: limiter.borrowed_tokens >= limiter.total_tokens,
                    10,
                    "all threads busy",
                    step=0.05,
                )
                with trio.fail_after(3):
                    assert await own.transaction(answer) == 2
                release.set()
        finally:
            release.set()
