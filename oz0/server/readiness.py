"""Whether this server should be sent work (`GET /readyz`): its database answers, its
membership row is fresh and its Temporal host serves. `GET /healthz` asks none of this.

The database is asked at most once every DATABASE_CHECK_EVERY however often anyone
probes, and a probe waits at most DATABASE_TIMEOUT for it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from oz0.store.outage import DATABASE_ERRORS
from oz0.store.pool import Database

DATABASE_CHECK_EVERY = 1.0
DATABASE_TIMEOUT = 2.0
# Three heartbeats missed (oz0.membership beats every second): others soon stop
# counting this server as up (after membership.UP_WINDOW).
HEARTBEAT_STALE = 3.0


def _ping(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1")


@dataclass
class Readiness:
    db: Database
    heartbeat_age: Callable[[], float | None]
    temporal_state: Callable[[], str]
    _checked_at: float | None = None
    _answered: bool = False
    _lock: trio.Lock = field(default_factory=trio.Lock)

    async def why_not(self) -> list[str]:
        """What keeps this server from being ready; empty when it is."""
        reasons = []
        if not await self._database_answers():
            reasons.append("the database does not answer")
        age = self.heartbeat_age()
        if age is None or age > HEARTBEAT_STALE:
            reasons.append("this server's membership heartbeat is not fresh")
        state = self.temporal_state()
        if state != "serving":
            reasons.append(f"Temporal is {state}")
        return reasons

    async def _database_answers(self) -> bool:
        async with self._lock:
            now = trio.current_time()
            if self._checked_at is None or now - self._checked_at >= DATABASE_CHECK_EVERY:
                self._answered = await self._ask_database()
                self._checked_at = trio.current_time()
            return self._answered

    async def _ask_database(self) -> bool:
        with trio.move_on_after(DATABASE_TIMEOUT):
            try:
                # Abandoned at the deadline, the thread ends within the pool's own timeout.
                await trio.to_thread.run_sync(
                    self.db.transaction_in_thread, _ping, abandon_on_cancel=True
                )
            except DATABASE_ERRORS:
                return False
            return True
        return False
