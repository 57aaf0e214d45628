"""The asyncio portal (oz0_common/asyncio_portal.py) on its own: calls, cancellation both
ways, an exception crossing, a failure logged, and a loop that will not stop reported.
No sockets: real threads and real asyncio loops only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time

import pytest
import trio

from oz0_common.asyncio_portal import CallCancelled, PortalClosed, PortalStuck, asyncio_portal

BOUND = 10.0


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
            await trio.to_thread.run_sync(cancelled.wait, BOUND)
            assert cancelled.is_set()


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

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # the bug this reports
                await asyncio.sleep(3600)

    with trio.fail_after(BOUND):
        began = time.monotonic()
        with pytest.raises(PortalStuck, match=r"did not stop within 0\.5 s"):
            async with asyncio_portal("oz0-test-stuck", stop_within=0.5) as portal:
                portal.call_soon(lambda: asyncio.get_running_loop().create_task(stubborn()))
                await portal.call(asyncio.sleep, 0.05)
        assert time.monotonic() - began < 3.0
    assert any("oz0-test-stuck: its asyncio thread did not stop" in m for m in caplog.messages)
    # Let it go, so the test leaves no thread behind.
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == "oz0-test-stuck")
    portal.call_soon(lambda: [t.cancel() for t in asyncio.all_tasks()])
    await trio.to_thread.run_sync(thread.join, BOUND)
    assert not thread.is_alive()


async def test_a_block_left_with_an_error_keeps_it_even_if_the_thread_is_stuck(
    caplog: pytest.LogCaptureFixture,
) -> None:
    release = threading.Event()

    async def stubborn() -> None:
        while not release.is_set():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    with trio.fail_after(BOUND), pytest.raises(Boom):
        async with asyncio_portal("oz0-test-stuck-error", stop_within=0.2) as portal:
            portal.call_soon(lambda: asyncio.get_running_loop().create_task(stubborn()))
            await portal.call(asyncio.sleep, 0.05)
            raise Boom("the block's own error")
    assert any("oz0-test-stuck-error: its asyncio thread" in m for m in caplog.messages)
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == "oz0-test-stuck-error")
    portal.call_soon(lambda: [t.cancel() for t in asyncio.all_tasks()])
    await trio.to_thread.run_sync(thread.join, BOUND)
    assert not thread.is_alive()


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
