from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import trio
import trio.testing

from oz0 import membership


class FlakyDatabase:
    """Records each transaction's time; fails the ones whose numbers are in FAIL."""

    def __init__(self, fail: set[int]) -> None:
        self.fail = fail
        self.calls: list[float] = []

    async def transaction(self, work: Callable[[Any], object]) -> None:
        self.calls.append(trio.current_time())
        if len(self.calls) in self.fail:
            raise psycopg.OperationalError("connection refused (injected)")


async def test_heartbeat_every_second_and_through_database_failures(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = FlakyDatabase(fail={3, 4})
    async with trio.open_nursery() as nursery:
        await nursery.start(membership.run, db, "server-1", "127.0.0.11")
        began = trio.current_time()
        await trio.sleep(6.5)
        nursery.cancel_scope.cancel()
    # register at 0, then one beat a second (two of them failing), then the leave.
    assert [round(t - began, 6) for t in db.calls] == [0, 1, 2, 3, 4, 5, 6, 6.5]
