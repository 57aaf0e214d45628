"""oz0.store.batches against the real PostgreSQL of the suite: changes that arrive while a
batch is written share the next transaction; a refusal is that change's alone; a change
that breaks its transaction is written again alone so its neighbours still are."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Callable
from typing import NoReturn, TypeVar, cast

import psycopg
import psycopg.errors
import pytest
import trio
import trio.testing

from fixtures.cluster import REPO
from fixtures.postgres import admin_url
from oz0.store.batches import GATHER, QUIET, Batches
from oz0.store.pool import Conn, Database, open_database

T = TypeVar("T")


class Refused(Exception):
    pass


@pytest.fixture
async def table() -> AsyncIterator[str]:
    name = "oz0_batches_" + secrets.token_hex(4)
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (k text PRIMARY KEY)")
    try:
        yield name
    finally:
        with psycopg.connect(admin_url(), autocommit=True) as conn:
            conn.execute(f"DROP TABLE {name}")


def insert(table: str, key: str, refuse: bool = False) -> Callable[[Conn], int]:
    """Write KEY (refusing first if REFUSE); the transaction's ID."""

    def work(conn: Conn) -> int:
        if refuse:
            raise Refused(key)
        conn.execute(f"INSERT INTO {table} (k) VALUES (%s)", (key,))
        row = conn.execute("SELECT txid_current()").fetchone()
        assert row is not None
        return int(row[0])

    return work


def keys(table: str) -> set[str]:
    with psycopg.connect(admin_url()) as conn:
        return {str(r[0]) for r in conn.execute(f"SELECT k FROM {table}")}


async def run_all(
    db: Database, works: list[Callable[[Conn], int]], *, turns: int = 1
) -> list[object]:
    """Every work through one served Batches, all at once: each one's result or error.
    TURNS: the works arrive over that many turns of the event loop, as requests parsed
    one after another do."""
    batches = Batches(db, (Refused,))
    outcomes: list[object] = [None] * len(works)

    async def one(i: int) -> None:
        for _ in range(i % turns):
            await trio.lowlevel.checkpoint()
        try:
            outcomes[i] = await batches.run(works[i])
        except Exception as e:
            outcomes[i] = e

    async with trio.open_nursery() as nursery:
        await nursery.start(batches.serve)
        async with trio.open_nursery() as requests:
            for i in range(len(works)):
                requests.start_soon(one, i)
        nursery.cancel_scope.cancel()
    return outcomes


async def test_changes_that_arrive_together_share_a_transaction(table: str) -> None:
    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        outcomes = await run_all(db, [insert(table, f"k{i}") for i in range(40)])
    assert all(isinstance(o, int) for o in outcomes), outcomes
    # Those queued before the writer looked make its first batch, the rest the next one.
    assert len(set(outcomes)) <= 2
    assert keys(table) == {f"k{i}" for i in range(40)}


async def test_a_burst_that_arrives_over_several_turns_of_the_loop_makes_one_batch(
    table: str, mock_clock: trio.testing.MockClock
) -> None:
    # Trio's clock stands still (a MockClock at rate 0): what makes the first wait for the
    # others is that they keep coming, not how fast this machine gets through six turns
    # (under load, a pause of over QUIET between two turns split the burst in CI).
    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        outcomes = await run_all(db, [insert(table, f"k{i}") for i in range(40)], turns=6)
    assert all(isinstance(o, int) for o in outcomes), outcomes
    assert len(set(outcomes)) == 1, "the first to arrive did not wait for the others"
    assert keys(table) == {f"k{i}" for i in range(40)}


async def test_a_refusal_is_that_changes_alone(table: str) -> None:
    works = [insert(table, f"k{i}", refuse=i % 3 == 0) for i in range(12)]
    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        outcomes = await run_all(db, works)
    refused = [i for i, o in enumerate(outcomes) if isinstance(o, Refused)]
    assert refused == [0, 3, 6, 9]
    assert keys(table) == {f"k{i}" for i in range(12) if i % 3}
    assert len({o for o in outcomes if isinstance(o, int)}) <= 2


async def test_a_change_that_breaks_the_transaction_fails_alone(table: str) -> None:
    with psycopg.connect(admin_url(), autocommit=True) as conn:
        conn.execute(f"INSERT INTO {table} (k) VALUES ('taken')")
    works = [insert(table, f"k{i}") for i in range(6)]
    works[4] = insert(table, "taken")
    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        outcomes = await run_all(db, works)
    assert isinstance(outcomes[4], psycopg.errors.UniqueViolation)
    assert all(isinstance(o, int) for i, o in enumerate(outcomes) if i != 4), outcomes
    assert keys(table) == {"taken", *(f"k{i}" for i in range(6) if i != 4)}


async def test_before_it_is_served_each_change_has_its_own_transaction(table: str) -> None:
    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        batches = Batches(db, (Refused,))
        first = await batches.run(insert(table, "a"))
        second = await batches.run(insert(table, "b"))
        with pytest.raises(Refused):
            await batches.run(insert(table, "c", refuse=True))
    assert first != second
    assert keys(table) == {"a", "b"}


async def test_a_change_that_comes_while_a_batch_is_written_does_not_wait_for_it(
    table: str,
) -> None:
    writing, release = threading.Event(), threading.Event()

    def slow(conn: Conn) -> int:
        writing.set()
        # The first batch holds its transaction open until the second has committed.
        if not release.wait(timeout=10):
            raise TimeoutError("the second change was not written while the first batch was")
        return insert(table, "first")(conn)

    async with open_database(admin_url(), min_size=1, max_size=2) as db:
        batches = Batches(db, (Refused,))
        async with trio.open_nursery() as nursery:
            await nursery.start(batches.serve)
            first: list[int] = []
            first_done = trio.Event()

            async def run_first() -> None:
                first.append(await batches.run(slow))
                first_done.set()

            nursery.start_soon(run_first)
            assert await trio.to_thread.run_sync(writing.wait, 10)
            with trio.fail_after(5):
                second = await batches.run(insert(table, "second"))
            assert keys(table) == {"second"}
            release.set()
            with trio.fail_after(10):
                await first_done.wait()
            nursery.cancel_scope.cancel()
    assert first[0] != second
    assert keys(table) == {"first", "second"}


class _Recorded:
    """A database that writes nothing and notes the (mock) time of each transaction."""

    def __init__(self) -> None:
        self.at: list[float] = []

    async def transaction(self, work: Callable[[Conn], T]) -> T:
        self.at.append(trio.current_time())
        return work(cast(Conn, None))


async def test_a_lone_change_on_a_busy_server_waits_only_while_changes_keep_coming(
    mock_clock: trio.testing.MockClock,
) -> None:
    db = _Recorded()
    batches = Batches(cast(Database, db), (Refused,))

    # Another task always runnable, as on a server with thousands of streams.
    async def busy() -> NoReturn:
        while True:
            mock_clock.jump(0.0002)
            await trio.lowlevel.checkpoint()

    async with trio.open_nursery() as nursery:
        await nursery.start(batches.serve)
        nursery.start_soon(busy)
        sent = trio.current_time()
        await batches.run(lambda conn: 1)
        nursery.cancel_scope.cancel()
    assert len(db.at) == 1
    waited = db.at[0] - sent
    assert QUIET <= waited < GATHER / 2, f"written {waited * 1000:.1f} ms after it came"


def test_a_server_imports_no_test_tools() -> None:
    """trio.testing imports pytest where it is installed, as here: a tenth of a CPU-second
    more for each of the suite's servers. The batcher takes its one function from trio's
    core instead (the burst tests above show it still waits for the other tasks)."""
    tools = "{'pytest', 'trio.testing'}"
    probe = f"import sys, oz0.server.start; print(sorted({tools} & {{*sys.modules}}))"
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60,
        check=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
    )  # fmt: skip
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
