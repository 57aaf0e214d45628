"""Queries under Trio: a sync psycopg pool driven through worker threads.

psycopg's AsyncConnection needs asyncio, so every query runs in a thread with a pooled
connection; the Trio task waits for it without blocking the event loop.
"""

from __future__ import annotations

import select
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

import psycopg
import trio
from psycopg_pool import ConnectionPool

T = TypeVar("T")
Conn = psycopg.Connection[Any]

# How long a query waits for a pooled connection: while the database is down, an API call
# answers "unavailable" within this, not after the CLI gave up.
WAIT_FOR_CONNECTION = 5.0
RECONNECT_GIVE_UP = 2.0
# A stopping server cancels the statements still running (cancel_running): each cancel
# request gets this long.
CANCEL_TIMEOUT = 1.0
# Every connection: a bounded connect, and keepalives so a database that vanished without a
# word (a failover, a cut network) is noticed in about 10 s instead of the kernel's hours.
CONNECTION_KWARGS: dict[str, Any] = {
    "application_name": "orchestrator-zero",
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


def check_if_spoken_to(conn: Conn) -> None:
    """Before the pool lends CONN: raise if it is broken, so that the pool replaces it.

    An idle connection the database has ended (a restart, an administrator's kill) has
    something to read, the server's last words or the end of the stream: only then is it
    asked with a round trip. Asking every time cost each transaction a round trip, and
    under load a wait for the interpreter's lock in its worker thread after it. A network
    that vanished without a word is the keepalives' to find (CONNECTION_KWARGS)."""
    if conn.closed:
        raise psycopg.OperationalError("the connection is closed")
    # poll, not select: a server with thousands of streams has descriptors above 1024.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    if poller.poll(0):
        ConnectionPool.check_connection(conn)


class _Running:
    """The pool's connections running a transaction now, across worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._conns: set[Conn] = set()

    @contextmanager
    def holding(self, conn: Conn) -> Iterator[None]:
        with self._lock:
            self._conns.add(conn)
        try:
            yield
        finally:
            with self._lock:
                self._conns.discard(conn)

    def now(self) -> list[Conn]:
        with self._lock:
            return list(self._conns)


class Database:
    def __init__(
        self,
        pool: ConnectionPool[Conn],
        limiter: trio.CapacityLimiter | None = None,
        running: _Running | None = None,
    ) -> None:
        self._pool = pool
        # None: Trio's default worker threads, shared with every other blocking call.
        self._limiter = limiter
        self._running = running or _Running()

    def sharing(self, threads: int) -> Database:
        """The same pool, for callers whose queries may take at most THREADS of its
        connections at a time: a crowd of them cannot make everyone else's queries wait."""
        return Database(self._pool, trio.CapacityLimiter(threads), self._running)

    async def cancel_running(self) -> int:
        """Ask the database to cancel every statement running on the pool now; returns
        how many. For a server that stops: a Trio task waiting on a query's thread cannot
        be cancelled until the query ends, and one waiting on a lock may never end."""
        running = self._running.now()
        with trio.move_on_after(CANCEL_TIMEOUT):
            async with trio.open_nursery() as nursery:
                for conn in running:
                    nursery.start_soon(
                        partial(
                            trio.to_thread.run_sync,
                            partial(conn.cancel_safe, timeout=CANCEL_TIMEOUT),
                            abandon_on_cancel=True,
                        )
                    )
        return len(running)

    async def transaction(self, work: Callable[[Conn], T]) -> T:
        """Run WORK(conn) in one transaction, committed when it returns."""
        return await trio.to_thread.run_sync(
            self.transaction_in_thread, work, limiter=self._limiter
        )

    def transaction_in_thread(self, work: Callable[[Conn], T]) -> T:
        """`transaction` for code that is already in a thread of its own (asyncio's, say).

        A connection the database ended while WORK ran (before its commit, so nothing of it
        was written) is replaced and WORK run once more: the pool asks an idle connection
        with a round trip only once the database has spoken on it (check_if_spoken_to), and
        one ended a moment before it was lent has not yet said so. Before that one more
        try, every idle connection is asked.
        """
        try:
            return self._transaction_once(work)
        except _LostBeforeCommit:
            # What ended it (a restart, a kill of every session) may have ended the pool's
            # idle ones at the same moment, before they could say so: each is asked with a
            # round trip now, and those that fail replaced, so that the one more try is not
            # lent another of them (CI saw a `node list` fail so right after such a kill).
            self._pool.check()
        try:
            return self._transaction_once(work)
        except _LostBeforeCommit as again:
            raise again.error from None

    def _transaction_once(self, work: Callable[[Conn], T]) -> T:
        with self._pool.connection() as conn, self._running.holding(conn), conn.transaction():
            try:
                return work(conn)
            except psycopg.OperationalError as e:
                if conn.broken:
                    raise _LostBeforeCommit(e) from e
                raise

    def use(self) -> PoolUse:
        """How the pool's connections are used right now (cheap: no query, no thread)."""
        stats = self._pool.get_stats()
        size = stats.get("pool_size", 0)
        return PoolUse(
            in_use=size - stats.get("pool_available", 0),
            size=size,
            max_size=stats.get("pool_max", 0),
            waiting=stats.get("requests_waiting", 0),
        )


class _LostBeforeCommit(Exception):
    def __init__(self, error: psycopg.OperationalError) -> None:
        super().__init__(str(error))
        self.error = error


@dataclass(frozen=True)
class PoolUse:
    in_use: int
    size: int
    max_size: int
    # Queries waiting for a connection: above zero for long, the pool is too small.
    waiting: int


@asynccontextmanager
async def open_database(
    conninfo: str,
    *,
    min_size: int = 2,
    max_size: int = 8,
    name: str = "oz0",
    own_threads: bool = False,
) -> AsyncIterator[Database]:
    """A pool of MIN_SIZE to MAX_SIZE connections; with OWN_THREADS its queries run in
    MAX_SIZE worker threads of its own, so they never queue behind other blocking calls."""
    pool: ConnectionPool[Conn] = ConnectionPool(
        conninfo,
        min_size=min_size,
        max_size=max_size,
        open=False,
        timeout=WAIT_FOR_CONNECTION,
        name=name,
        kwargs=CONNECTION_KWARGS,
        # A connection broken by a restart is found before use, not by the query given it.
        check=check_if_spoken_to,
        # The pool's own reconnect backoff doubles without a cap below this; given up
        # early, the next query starts a fresh attempt, so after an outage of any length
        # the pool is back within about a second of the database.
        reconnect_timeout=RECONNECT_GIVE_UP,
    )
    await trio.to_thread.run_sync(lambda: pool.open(wait=True, timeout=10.0))
    try:
        yield Database(pool, trio.CapacityLimiter(max_size) if own_threads else None)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(lambda: pool.close(timeout=2.0))
