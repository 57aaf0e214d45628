"""The bridge between Trio and asyncio (oz0_common/asyncio_portal.py) on its own, both
ways: calls, cancellation from either side (a cancelled call returns once the other side
has ended), an exception crossing, deadlines, a failure logged, and a loop that will not
stop reported. No sockets: real threads, real asyncio loops and this test's Trio run."""

from __future__ import annotations

import ast
import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import pytest
import trio

from fixtures.syntax_trees import parsed
from oz0_common.asyncio_portal import (
    CallCancelled,
    Portal,
    PortalClosed,
    PortalStuck,
    TrioPortal,
    asyncio_portal,
)

BOUND = 10.0
ROOT = Path(__file__).resolve().parent.parent
# What crosses between a Trio run and an asyncio loop by hand.
CROSSINGS = {
    "run_sync_soon",
    "TrioToken",
    "current_trio_token",
    "from_thread",
    "run_coroutine_threadsafe",
    "call_soon_threadsafe",
}


def stubborn_until(
    release: threading.Event, nap: float = 3600.0
) -> Callable[[], Coroutine[Any, Any, None]]:
    """A coroutine function whose task swallows every cancellation until RELEASE is set:
    the bug the portal must report (or name) rather than hang on."""

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(nap)

    return stubborn


def start_stubborn(portal: Portal, release: threading.Event) -> None:
    portal.call_soon(lambda: asyncio.get_running_loop().create_task(stubborn_until(release)()))


async def let_go(portal: Portal, thread_name: str, release: threading.Event) -> None:
    """Release the stubborn task and see the portal's thread end: the test leaves no
    thread behind."""
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == thread_name)
    portal.call_soon(lambda: [t.cancel() for t in asyncio.all_tasks()])
    await trio.to_thread.run_sync(thread.join, BOUND)
    assert not thread.is_alive()


class Boom(Exception):
    pass


async def test_a_call_runs_on_the_portals_own_loop_in_its_own_thread() -> None:
    async def where(x: int) -> tuple[int, str, bool]:
        asyncio.get_running_loop()  # raises outside a loop
        return x * 2, threading.current_thread().name, True

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            assert await portal.call(where, 21) == (42, "oz0-test-portal", True)
    assert not [t for t in threading.enumerate() if t.name == "oz0-test-portal"]


async def echo(text: str) -> str:
    await asyncio.sleep(0)
    return text


async def test_an_exception_on_the_asyncio_side_is_raised_to_the_trio_caller() -> None:
    async def fails() -> None:
        await asyncio.sleep(0)
        raise Boom("from asyncio")

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            with pytest.raises(Boom, match="from asyncio"):
                await portal.call(fails)
            assert await portal.call(echo, "still works") == "still works"


async def test_a_trio_cancellation_cancels_the_asyncio_task() -> None:
    started, cancelled = threading.Event(), threading.Event()

    async def forever() -> None:
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            with trio.move_on_after(0.2) as scope:
                await portal.call(forever)
            assert scope.cancelled_caught and started.is_set()
            assert cancelled.is_set(), "the call returned before its asyncio task was cancelled"


async def test_an_asyncio_side_cancellation_is_call_cancelled_in_trio() -> None:
    async def cancels_itself() -> None:
        task = asyncio.current_task()
        assert task is not None
        asyncio.get_running_loop().call_soon(task.cancel)
        await asyncio.sleep(3600)

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            with pytest.raises(CallCancelled):
                await portal.call(cancels_itself)


async def test_long_work_that_fails_is_logged_with_its_traceback_and_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def worker() -> None:
        await asyncio.sleep(0.01)
        raise Boom("the worker died")

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            with pytest.raises(Boom):
                await portal.run("the test worker", worker)
    [record] = [r for r in caplog.records if r.getMessage() == "the test worker failed"]
    assert record.levelno == logging.ERROR
    assert record.exc_info is not None and record.exc_info[0] is Boom


async def test_leaving_the_block_cancels_what_still_runs_on_the_loop() -> None:
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            portal.call_soon(lambda: asyncio.get_running_loop().create_task(forever()))
            await portal.call(asyncio.sleep, 0.05)
    assert cancelled.is_set()
    with pytest.raises(PortalClosed):
        await portal.call(asyncio.sleep, 0)


async def test_a_task_that_will_not_stop_is_reported_within_the_bound(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    with trio.fail_after(BOUND):
        began = time.monotonic()
        with pytest.raises(PortalStuck, match=r"did not stop within 0\.5 s"):
            async with asyncio_portal("oz0-test-stuck", stop_within=0.5) as portal:
                start_stubborn(portal, release)
                await portal.call(asyncio.sleep, 0.05)
        assert time.monotonic() - began < 3.0
    assert any("oz0-test-stuck: its asyncio thread did not stop" in m for m in caplog.messages)
    await let_go(portal, "oz0-test-stuck", release)


async def test_a_cancelled_call_whose_task_will_not_end_is_named_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    async with asyncio_portal("oz0-test-named", stop_within=0.3) as portal:
        began = time.monotonic()
        with trio.move_on_after(0.2):
            await portal.call(stubborn_until(release, nap=0.05))
        assert time.monotonic() - began < 2.0
        assert any(
            "oz0-test-named:" in m and "stubborn" in m and "had not ended 0.3 s" in m
            for m in caplog.messages
        ), caplog.messages
        release.set()


async def test_a_block_left_with_an_error_keeps_it_even_if_the_thread_is_stuck(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()
    with trio.fail_after(BOUND), pytest.raises(Boom):
        async with asyncio_portal("oz0-test-stuck-error", stop_within=0.2) as portal:
            start_stubborn(portal, release)
            await portal.call(asyncio.sleep, 0.05)
            raise Boom("the block's own error")
    assert any("oz0-test-stuck-error: its asyncio thread" in m for m in caplog.messages)
    await let_go(portal, "oz0-test-stuck-error", release)


async def test_a_cancelled_call_returns_once_its_asyncio_side_has_ended() -> None:
    """An asyncio side that awaits in its `finally` (a worker shutting down) runs that to
    its end before the cancelled call returns, and is cancelled once only: the portal's
    exit finds nothing left to cancel again."""
    started, finished = threading.Event(), threading.Event()
    cancellations = 0

    async def shuts_down_slowly() -> None:
        nonlocal cancellations
        started.set()
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            cancellations += 1
            raise
        finally:
            try:
                await asyncio.sleep(0.3)  # its shutdown
            except asyncio.CancelledError:
                cancellations += 1
                raise
            finished.set()

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            with trio.move_on_after(0.2) as scope:
                await portal.call(shuts_down_slowly)
            assert scope.cancelled_caught and started.is_set()
            assert finished.is_set(), "the call returned before its asyncio side ended"
    assert cancellations == 1


async def test_a_call_cancelled_before_its_task_ran_returns_at_once() -> None:
    async def never_started() -> None:
        await asyncio.sleep(3600)

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal", stop_within=5.0) as portal:
            began = trio.current_time()
            with trio.CancelScope() as scope:
                scope.cancel()
                await portal.call(never_started)
            assert trio.current_time() - began < 1.0


# --- asyncio to Trio ---------------------------------------------------------------------


async def test_a_call_from_asyncio_runs_in_the_trio_run_and_its_loop_runs_on() -> None:
    """From a coroutine on the portal's loop into this test's Trio run and back: the value
    comes back, the Trio side ran in Trio's thread, and the loop was not blocked."""
    to_trio = TrioPortal("oz0-test-to-trio")
    trio_thread = threading.current_thread()

    async def in_trio(x: int) -> tuple[int, bool]:
        trio.lowlevel.current_task()  # raises outside Trio
        await trio.sleep(0.2)
        return x * 2, threading.current_thread() is trio_thread

    def in_trio_sync(x: int) -> tuple[int, bool]:
        trio.lowlevel.current_task()
        return x + 1, threading.current_thread() is trio_thread

    async def on_the_loop() -> tuple[tuple[int, bool], tuple[int, bool], int]:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.get_running_loop().create_task(tick())
        try:
            value = await to_trio.call(in_trio, 21, within=BOUND)
            plain = await to_trio.call_sync(in_trio_sync, 41, within=BOUND)
        finally:
            ticker.cancel()
        return value, plain, ticks

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            value, plain, ticks = await portal.call(on_the_loop)
    assert value == (42, True) and plain == (42, True)
    assert ticks >= 5, "the loop stood still while Trio ran the call"


async def test_an_exception_in_trio_is_raised_to_the_asyncio_caller() -> None:
    to_trio = TrioPortal("oz0-test-to-trio")

    async def fails() -> None:
        await trio.lowlevel.checkpoint()
        raise Boom("from Trio")

    def fails_sync() -> None:
        raise Boom("from Trio, plainly")

    async def on_the_loop() -> list[str]:
        caught = []
        try:
            await to_trio.call(fails, within=BOUND)
        except Boom as e:
            caught.append(str(e))
        try:
            await to_trio.call_sync(fails_sync, within=BOUND)
        except Boom as e:
            caught.append(str(e))
        return caught

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            assert await portal.call(on_the_loop) == ["from Trio", "from Trio, plainly"]


async def test_a_cancelled_call_into_trio_returns_once_its_trio_side_has_ended() -> None:
    """Cancelled on the asyncio side, the Trio task is cancelled, and its `finally` (which
    awaits, shielded, as a Trio cleanup does) runs to its end before the cancellation goes
    on: within the portal's bound, not after it."""
    to_trio = TrioPortal("oz0-test-to-trio", stop_within=5.0)
    started, finished = trio.Event(), threading.Event()
    cancellations = 0

    async def shuts_down_slowly() -> None:
        nonlocal cancellations
        started.set()
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancellations += 1
            raise
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(0.3)  # its shutdown
            finished.set()

    async def on_the_loop() -> tuple[bool, float]:
        call = asyncio.get_running_loop().create_task(to_trio.call(shuts_down_slowly, within=BOUND))
        await asyncio.sleep(0.2)
        began = time.monotonic()
        call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await call
        return finished.is_set(), time.monotonic() - began

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            ended, took = await portal.call(on_the_loop)
    assert started.is_set()
    assert ended, "the cancelled call returned before its Trio side ended"
    assert 0.3 <= took < 5.0
    assert cancellations == 1


async def test_a_call_into_trio_past_its_deadline_is_cancelled_there_and_times_out() -> None:
    to_trio = TrioPortal("oz0-test-to-trio")
    cancelled = threading.Event()

    async def forever() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.set()
            raise

    async def on_the_loop() -> float:
        began = time.monotonic()
        with pytest.raises(TimeoutError, match=r"did not end within 0\.5 s"):
            await to_trio.call(forever, within=0.5)
        return time.monotonic() - began

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            took = await portal.call(on_the_loop)
    assert cancelled.is_set()
    assert 0.5 <= took < 3.0


def test_a_call_into_a_trio_run_that_has_ended_is_portal_closed() -> None:
    async def made_in_trio() -> TrioPortal:
        return TrioPortal("oz0-test-to-trio")

    to_trio = trio.run(made_in_trio)

    async def on_a_loop() -> None:
        with pytest.raises(PortalClosed, match="its Trio run has ended"):
            await to_trio.call(trio.sleep, 0, within=BOUND)
        with pytest.raises(PortalClosed):
            await to_trio.call_sync(len, "", within=BOUND)

    asyncio.run(on_a_loop())
    to_trio.call_soon(print, "never")  # nothing, and no error


async def test_call_soon_runs_in_trio_and_a_failure_is_logged_not_raised(
    caplog: pytest.LogCaptureFixture,
) -> None:
    to_trio = TrioPortal("oz0-test-to-trio")
    ran = trio.Event()

    def fails() -> None:
        raise Boom("in a callback")

    def runs() -> None:
        trio.lowlevel.current_task()
        ran.set()

    with trio.fail_after(BOUND):
        async with asyncio_portal("oz0-test-portal") as portal:
            portal.call_soon(to_trio.call_soon, fails)
            portal.call_soon(to_trio.call_soon, runs)
            await ran.wait()
    [record] = [r for r in caplog.records if "failed in Trio" in r.getMessage()]
    assert record.exc_info is not None and record.exc_info[0] is Boom


def test_the_two_loops_meet_only_in_the_portal() -> None:
    """docs/architecture.md, "Trio and asyncio": nothing of the product but the portal
    crosses between the two loops by hand."""
    found = []
    for package in ("oz0", "oz0_node", "oz0_common", "cli"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == ROOT / "oz0_common" / "asyncio_portal.py":
                continue
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.Attribute):
                    name, line = node.attr, node.lineno
                elif isinstance(node, ast.Name):
                    name, line = node.id, node.lineno
                else:
                    continue
                if name in CROSSINGS:
                    found.append(f"{path.relative_to(ROOT)}:{line} {name}")
    assert not found, "crossings outside the portal:\n" + "\n".join(found)
