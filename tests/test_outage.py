"""Database loops outlive an outage: on Trio's mock clock, with a database that fails on
purpose (a fake, to inject the fault)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import psycopg
import pytest
import trio
import trio.lowlevel
import trio.testing

from oz0.membership import UP_WINDOW
from oz0.server.edge.directory import DIRECTORY_EVERY, EdgeDirectory
from oz0.server.edge.tracking import SeenTracker, StreamReconciler
from oz0.store.events import EventHub
from oz0.store.outage import MAX_RETRY, Outage, until_it_works
from oz0.store.pool import Database
from oz0.temporal.host_keeper import HostKeeper, HostSettings, HostUnavailable
from oz0.temporal.node_access import NodeAccessSync
from oz0.temporal.role import StateRecorder


class FlakyDatabase:
    """Fails every transaction while `down`; otherwise answers with ANSWER(conn=None)."""

    def __init__(self, answer: Callable[[], Any]) -> None:
        self.down = False
        self.calls = 0
        self.answer = answer

    async def transaction(self, work: Callable[[Any], Any]) -> Any:
        self.calls += 1
        await trio.lowlevel.checkpoint()
        if self.down:
            raise psycopg.OperationalError("terminating connection due to administrator command")
        return self.answer()


def as_db(fake: FlakyDatabase) -> Database:
    return cast(Database, fake)


async def test_an_outage_is_logged_once_and_its_end_once(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    log = logging.getLogger("test.outage")
    outage = Outage("the test loop", log)
    delays = [outage.failed(psycopg.OperationalError("gone")) for _ in range(10)]
    await trio.sleep(7)
    outage.worked()
    outage.worked()
    messages = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == log.name]
    assert messages == [
        ("WARNING", "the test loop failed, retrying: gone"),
        ("INFO", "the test loop works again after 7.0 s"),
    ]
    # Doubling from 0.5 s with jitter in [bound/2, bound], capped.
    assert 0.25 <= delays[0] <= 0.5 and 0.5 <= delays[1] <= 1.0
    assert all(MAX_RETRY / 2 <= d <= MAX_RETRY for d in delays[4:])
    # A new outage starts over.
    assert outage.failed(psycopg.OperationalError("again")) <= 0.5


async def test_until_it_works_waits_out_the_outage_and_returns(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FlakyDatabase(lambda: "answer")
    fake.down = True

    async def restore() -> None:
        await trio.sleep(10)
        fake.down = False

    async with trio.open_nursery() as nursery:
        nursery.start_soon(restore)
        outage = Outage("reading", logging.getLogger("test"))
        result = await until_it_works(outage, lambda: fake.transaction(lambda c: None))
    assert result == "answer"
    assert 10 <= trio.current_time() <= 10 + MAX_RETRY
    # Backoff, not a busy loop: about 10 s / growing waits, not thousands of tries.
    assert fake.calls < 12
    assert not outage.ongoing


async def test_the_stream_reconciler_survives_an_outage_and_wakes_streams_after_it(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FlakyDatabase(lambda: ["node-000000000001"])
    hub = EventHub("unused")
    reconciler = StreamReconciler(as_db(fake), hub)
    reconciler.opened("node-000000000001")
    fake.down = True
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        with hub.watch_node("node-000000000001", wake_on_gap=False) as woken:
            await trio.sleep(60)
            assert not woken.is_set()
            fake.down = False
            back = trio.current_time()
            await woken.wait()
            # Within the longest backoff of the time it came back.
            assert trio.current_time() - back <= MAX_RETRY + 1
        nursery.cancel_scope.cancel()
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "reconciling" in warnings[0].getMessage()


async def test_a_gap_wakes_pickups_but_not_streams_and_makes_the_reconciler_check(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FlakyDatabase(lambda: [])
    hub = EventHub("unused")
    reconciler = StreamReconciler(as_db(fake), hub, every=60)
    reconciler.opened("node-a")
    async with trio.open_nursery() as nursery:
        await nursery.start(reconciler.run)
        await trio.sleep(1)
        calls = fake.calls
        with (
            hub.watch_node("node-a", wake_on_gap=False) as stream,
            hub.watch_node("node-b") as pickup,
        ):
            hub._gap()
            await trio.sleep(0.1)
            assert pickup.is_set() and not stream.is_set()
            assert fake.calls == calls + 1, "the reconciler checked at once"
            hub.wake("node-a")
            assert stream.is_set()
        nursery.cancel_scope.cancel()


async def test_seen_batches_failed_in_an_outage_are_written_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    written: list[int] = []
    fake = FlakyDatabase(lambda: written.append(1))
    tracker = SeenTracker(as_db(fake), "server-1")
    tracker.alive("node-a")
    tracker.left("node-b")
    fake.down = True
    await tracker.flush()
    assert tracker.pending == {"node-a"} and tracker.gone == {"node-b"}
    # News during the outage wins over the kept batch.
    tracker.left("node-a")
    fake.down = False
    await tracker.flush()
    assert written == [1] and not tracker.pending and not tracker.gone


async def test_node_access_sync_outlives_an_outage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FlakyDatabase(lambda: ({}, 0))
    hub = EventHub("unused")
    keeper = idle_keeper()

    async def never(op: str, **_: Any) -> dict[str, Any]:
        raise AssertionError(f"asked {op}: the database is away, then has no change to push")

    keeper.command = never  # type: ignore[method-assign]
    sync = NodeAccessSync(as_db(fake), hub, keeper)
    fake.down = True
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run)
        sync._pending_ids.add("node-a")
        await trio.sleep(30)
        assert "node-a" in sync._pending_ids, "kept for when the database is back"
        fake.down = False
        await trio.sleep(MAX_RETRY + 1)
        assert not sync.outage.ongoing
        nursery.cancel_scope.cancel()


async def test_temporal_state_recorded_in_an_outage_is_written_when_it_ends(
    autojump_clock: trio.testing.MockClock,
) -> None:
    fake = FlakyDatabase(lambda: None)
    recorder = StateRecorder(as_db(fake), "server-1")
    fake.down = True
    async with trio.open_nursery() as nursery:
        nursery.start_soon(recorder.retry_forever)
        await recorder.record("restarting")
        await recorder.record("serving")
        assert recorder.unwritten == "serving"
        await trio.sleep(20)
        fake.down = False
        await trio.sleep(MAX_RETRY + 1)
        assert recorder.unwritten is None
        nursery.cancel_scope.cancel()


async def test_after_an_outage_the_edge_list_does_not_shrink_while_heartbeats_catch_up(
    autojump_clock: trio.testing.MockClock,
) -> None:
    a, b, c = (f"127.0.0.{i}:7443" for i in (11, 12, 13))
    seen: dict[str, set[str]] = {"up": {a, b, c}, "lingering": {a, b, c}}
    fake = FlakyDatabase(lambda: (seen["up"], seen["lingering"]))
    directory = EdgeDirectory(as_db(fake), own=a)
    async with trio.open_nursery() as nursery:
        await nursery.start(directory.run)
        assert directory.edges == [a, b, c]
        fake.down = True
        await trio.sleep(20)
        # Back, but every other server's heartbeat is older than twice the up window.
        seen.update(up=set(), lingering=set())
        fake.down = False
        await trio.sleep(2 * DIRECTORY_EVERY + 0.1)
        assert directory.edges == [a, b, c], "no server dropped for an outage of ours"
        seen.update(up={a, b}, lingering={a, b})
        await trio.sleep(2 * UP_WINDOW.total_seconds() + 2 * DIRECTORY_EVERY)
        # Once heartbeats had time to come back, a server really gone does leave.
        assert directory.edges == [a, b]
        nursery.cancel_scope.cancel()


async def test_a_block_a_restarting_host_missed_is_pushed_as_it_serves(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The host's table was read as it (re)started; a block committed before it served could
    # not be pushed (HostUnavailable), and waited for the sync's next round, up to
    # RECONCILE_EVERY after the host served.
    fake = FlakyDatabase(lambda: ({"node-a": {"state": "blocked"}}, 7))
    pushed: list[float] = []

    keeper = idle_keeper()

    async def command(op: str, **_: Any) -> dict[str, Any]:
        if keeper.state != "serving":
            raise HostUnavailable("Temporal is restarting; try again shortly")
        pushed.append(trio.current_time())
        return {}

    keeper.command = command  # type: ignore[method-assign]
    sync = NodeAccessSync(as_db(fake), EventHub("unused"), keeper)
    async with trio.open_nursery() as nursery:
        await nursery.start(sync.run)
        sync._pending_ids.add("node-a")
        sync._wake.set()
        await trio.sleep(0.3)
        assert pushed == [] and "node-a" in sync._pending_ids
        served = trio.current_time()
        await keeper._set_state("serving")
        await trio.sleep(0.01)
        assert pushed and pushed[0] - served < 0.01
        nursery.cancel_scope.cancel()


def idle_keeper() -> HostKeeper:
    """A keeper whose host is never started: the test sets its states."""

    async def record(state: str) -> None:
        await trio.lowlevel.checkpoint()

    return HostKeeper(cast(HostSettings, None), tls=dict, on_state=record)
