"""The sweep for sessions of stopped servers (oz0/server/session_sweeper.py), on Trio's mock
clock: once as the server starts (before it says it has started), then every SWEEP_EVERY,
and on through a database outage (the ending itself: tests/test_session_records.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import trio
import trio.testing

from oz0.server import session_sweeper
from oz0.store.outage import FIRST_RETRY


class FlakyDatabase:
    """Records each transaction's time; fails the ones whose numbers are in FAIL."""

    def __init__(self, fail: set[int]) -> None:
        self.fail = fail
        self.calls: list[float] = []

    async def transaction(self, work: Callable[[Any], object]) -> list[str]:
        self.calls.append(trio.current_time())
        if len(self.calls) in self.fail:
            raise psycopg.OperationalError("connection refused (injected)")
        return []


async def test_a_sweep_at_start_then_every_two_seconds_and_through_an_outage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = FlakyDatabase(fail={3})
    async with trio.open_nursery() as nursery:
        began = trio.current_time()
        await nursery.start(session_sweeper.run, db, "server-1")
        assert db.calls == [began]  # swept before the start is over
        await trio.sleep(7)
        nursery.cancel_scope.cancel()
    every = session_sweeper.SWEEP_EVERY
    # The third fails: tried again after the outage's first wait (with jitter), then
    # every two seconds again.
    at = [round(t - began, 3) for t in db.calls]
    assert at[:3] == [0, every, 2 * every]
    assert 2 * every < at[3] <= 2 * every + FIRST_RETRY
    assert at[4] == round(at[3] + every, 3)
