from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio
import trio.testing

from oz0.server.edge.tracking import LEFT_SETTLE, SeenTracker


class RecordingConnection:
    def __init__(self) -> None:
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    def execute(self, sql: str, params: tuple[Any, ...]) -> None:
        # The node IDs go as one comma-separated text (_id_list): shown as a list.
        ids = "string_to_array" in sql
        shown = tuple(
            p.split(",") if ids and isinstance(p, str) and p.startswith("node-") else p
            for p in params
        )
        self.statements.append((sql.split()[0] + (" NULL" if "= NULL" in sql else ""), shown))


class RecordingDatabase:
    def __init__(self) -> None:
        self.conn = RecordingConnection()
        self.times: list[float] = []

    async def transaction(self, work: Callable[[Any], object]) -> None:
        self.times.append(trio.current_time())
        work(self.conn)


@asynccontextmanager
async def tracking(db: RecordingDatabase) -> AsyncIterator[SeenTracker]:
    """DB's tracker running for the block in a nursery of its own, cancelled at its end as
    a server's stop cancels it."""
    tracker = SeenTracker(db, "server-1")  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(tracker.run)
        yield tracker
        nursery.cancel_scope.cancel()


async def test_heartbeats_alone_are_written_once_per_heartbeat_interval(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = RecordingDatabase()
    async with tracking(db) as tracker:
        tracker.alive("node-a")
        await trio.sleep(1)
        tracker.alive("node-b")
        await trio.sleep(5)
        tracker.alive("node-a")
        await trio.sleep(5)
    assert db.times == [5.0, 10.0]
    assert db.conn.statements == [
        ("UPDATE", ("server-1", ["node-a", "node-b"])),
        ("UPDATE", ("server-1", ["node-a"])),
    ]


async def test_an_ended_stream_is_written_soon_and_not_marked_seen_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = RecordingDatabase()
    async with tracking(db) as tracker:
        tracker.alive("node-a")
        tracker.alive("node-b")
        tracker.left("node-b")  # heard from, then its stream ended
        tracker.left("node-c")
        tracker.alive("node-c")  # ended, then reconnected here
        await trio.sleep(1)
        # Not at the next heartbeat (5 s): the web UI shows a disconnection within 2 s.
        assert db.times == [LEFT_SETTLE]
        await trio.sleep(10)
    # Nothing new after the first batch: no further writes, not even at shutdown.
    assert db.times == [LEFT_SETTLE]
    assert db.conn.statements == [
        # Both sets' rows locked together in ID order first (tests/test_lock_order.py).
        ("SELECT", (["node-a", "node-c", "node-b"],)),
        ("UPDATE NULL", (["node-b"], "server-1")),
        ("UPDATE", ("server-1", ["node-a", "node-c"])),
    ]


async def test_what_is_pending_at_shutdown_is_written(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = RecordingDatabase()
    async with tracking(db) as tracker:
        await trio.sleep(1)
        tracker.left("node-a")
    assert db.conn.statements == [
        ("UPDATE NULL", (["node-a"], "server-1")),
    ]


class SlowDatabase(RecordingDatabase):
    """Each round of the tracker writes SLOW seconds after it began (a busy database);
    `connect` records a new stream's node connected at once, as nodes.control_connect
    does (a statement of one row)."""

    SLOW = 0.1

    async def transaction(self, work: Callable[[Any], object]) -> None:
        self.times.append(trio.current_time())
        await trio.sleep(self.SLOW)
        work(self.conn)

    async def connect(self, node_id: str) -> None:
        await trio.lowlevel.checkpoint()
        self.conn.execute("CONNECT", (node_id,))


async def test_a_node_connecting_again_is_not_written_gone_after_its_new_stream_is_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Its stream ended, it connected again here while the flush writing it gone was under
    way: the flush's write lands first, so the node is shown connected (a renewal's new
    stream, tests/test_node_renewal.py, read `connected: false` once)."""
    db = SlowDatabase()
    async with tracking(db) as tracker:
        tracker.left("node-a")
        # The flush begins at LEFT_SETTLE and writes SLOW later; the new stream comes between.
        await trio.sleep(LEFT_SETTLE + SlowDatabase.SLOW / 2)
        async with tracker.connecting("node-a"):
            await db.connect("node-a")
            tracker.alive("node-a")
        await trio.sleep(1)
    assert [s for s in db.conn.statements if s[0] != "UPDATE"] == [
        ("UPDATE NULL", (["node-a"], "server-1")),
        ("CONNECT", ("node-a",)),
    ]


async def test_a_flush_leaves_a_node_connecting_out_and_writes_it_gone_once_refused(
    autojump_clock: trio.testing.MockClock,
) -> None:
    db = SlowDatabase()
    async with tracking(db) as tracker:
        tracker.left("node-a")
        tracker.left("node-b")
        async with tracker.connecting("node-a"):
            # The flush comes while node-a's new stream is being recorded: only node-b.
            await trio.sleep(LEFT_SETTLE + 2 * SlowDatabase.SLOW)
            assert db.conn.statements == [("UPDATE NULL", (["node-b"], "server-1"))]
            # Refused (blocked meanwhile, say): never said alive.
        await trio.sleep(1)
    # Written gone soon after, as any stream's end (not at the next heartbeat).
    assert db.conn.statements[1] == ("UPDATE NULL", (["node-a"], "server-1"))
    assert db.times[1] < 1.0
