"""The one bridge between Trio and asyncio (temporalio is asyncio-only), both ways: from
Trio into an asyncio loop after anyio's `from_thread.start_blocking_portal`, and from
asyncio code back into the Trio run after `trio.from_thread`.

    async with asyncio_portal("oz0-jobs", stop_within=5.0) as portal:
        result = await portal.call(some_async_fn, arg)      # one call, returns its result
        await portal.run("the job worker", serve_forever)   # long work; failure logged

    to_trio = TrioPortal("oz0-attempts")                     # made in the Trio run
    ...                                                      # then, on any asyncio loop:
        value = await to_trio.call(some_trio_fn, arg, within=5.0)
        answer = await to_trio.call_sync(manager.runs, job, number, within=5.0)
        to_trio.call_soon(publish)                           # from any thread

Trio to asyncio (`asyncio_portal`, `Portal`):

- `asyncio_portal` starts one thread running one asyncio event loop, owned by the block:
  the thread starts on entry and is joined on exit. Nothing else runs that loop.
- `call` schedules an async function on the loop and waits for it from Trio without
  blocking Trio (the asyncio side's completion wakes the Trio task through its token). A
  Trio cancellation cancels the asyncio task and waits for it to end, within STOP_WITHIN
  (an awaiting `finally` is not cut short); an exception raised on the asyncio side is
  raised to the Trio caller; an asyncio task cancelled from its own side is
  `CallCancelled`. `run` is `call` for long-running work: its failure is also logged, with
  its traceback, under the name given.
- On exit every task still on the loop is cancelled, the loop stopped and closed, and the
  thread joined, all within STOP_WITHIN. A thread that is still there then (a task that
  swallows its cancellation, or blocks the thread) is logged with its stack, and
  `PortalStuck` is raised (unless the block is left with an error already: that error is
  what the caller sees); the thread is a daemon, so it never holds up the process's exit.
- State the two sides share goes through the portal: code on the asyncio side owns what
  it makes (clients, workers) and Trio reaches it only with `call`.

asyncio to Trio (`TrioPortal`, made in the Trio run it calls into; it owns no thread):

- `call(fn, *args, within=)` runs `await FN(*ARGS)` in the Trio run as a task of its own
  (a system task, as `trio.from_thread.run` with a token runs it: the Trio code that made
  the portal being cancelled does not cancel it) and waits for it on the asyncio side
  without blocking the loop. Its result, or its exception, is returned or raised to the
  asyncio caller. Its deadline is WITHIN seconds on Trio's clock from when Trio takes it
  (`math.inf`: none, the caller ends the wait by cancelling it): past it the Trio task is
  cancelled and the caller gets `TimeoutError`. Cancelled on the asyncio side, the Trio
  task is cancelled too and waited for (its `finally` runs to its end) within the
  portal's STOP_WITHIN before the `CancelledError` goes on, so nothing of the call runs
  on once it has returned. A Trio task cancelled by the run ending is `CallCancelled`; a
  run that has ended is `PortalClosed`.
- `call_sync(fn, *args, within=)` runs the plain function FN(*ARGS) in Trio's thread and
  returns its result (or raises its exception), without blocking the loop meanwhile.
  `TimeoutError` if Trio has not run it within WITHIN seconds (it never runs then);
  cancelled before Trio ran it, it never runs (once it ran, its result is dropped).
- `call_soon(fn, *args)` calls the plain function FN(*ARGS) in Trio's thread soon, from any
  thread (Trio's own too), without waiting: nothing if the run has ended; its failure is
  logged (raised there it would end the run).
- `set_result_soon(future, value)`: an asyncio future settled from another thread (Trio's),
  unless it is done already or its loop has closed.

Used by the server's job worker (oz0/jobs/role.py), the server's namespace calls
(oz0/temporal/), and the node: its runtime (oz0_node/runtime.py), the attempt manager as
the runtime's activities reach it (oz0_node/jobs/manager_port.py), the held
attempts' answers (oz0_node/jobs/attempt.py) and the run record's news (oz0_node/agent.py).
This module is part of the agent: it imports trio and the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import trio

log = logging.getLogger(__name__)

T = TypeVar("T")
STOP_WITHIN = 5.0


class PortalClosed(Exception):
    """The portal's loop is not running (not yet, or no more)."""


class CallCancelled(Exception):
    """The asyncio side cancelled the call (the portal is stopping, say)."""


class PortalStuck(Exception):
    """The portal's thread did not end within its bound."""


class Portal:
    """Calls into one asyncio loop running in a thread of its own; see the module."""

    def __init__(self, name: str, stop_within: float = STOP_WITHIN) -> None:
        self.name = name
        self.stop_within = stop_within
        self._loop: asyncio.AbstractEventLoop | None = None

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """Run `await FN(*ARGS)` on the loop; its result, or its exception, here. Cancelled
        here, the asyncio task is cancelled and waited for (its `finally` runs to its end)
        within STOP_WITHIN, so nothing of the call runs on once it has returned."""
        loop = self._loop
        if loop is None:
            raise PortalClosed(f"{self.name}: its event loop is not running")
        token = trio.lowlevel.current_trio_token()
        ended = trio.Event()
        started: list[asyncio.Task[T]] = []

        def wake(_: object) -> None:
            with contextlib.suppress(trio.RunFinishedError):
                token.run_sync_soon(ended.set)

        def start() -> None:  # on the loop
            task = loop.create_task(_call(fn, args))
            started.append(task)
            # Whenever the task ends: even cancelled before its first step, when no code
            # of it (no `finally`) runs.
            task.add_done_callback(wake)

        def cancel() -> None:  # on the loop, after start (call_soon_threadsafe keeps order)
            started[0].cancel()

        try:
            loop.call_soon_threadsafe(start)
        except RuntimeError:  # the loop is closed
            raise PortalClosed(f"{self.name}: its event loop has stopped") from None
        try:
            await ended.wait()
        finally:
            if not ended.is_set():
                # Cancelled here (or failed in Trio): the asyncio task is cancelled too, and
                # waited for, as anyio's portal and trio.to_thread wait for theirs.
                with contextlib.suppress(RuntimeError):  # the loop closed: its tasks ended
                    loop.call_soon_threadsafe(cancel)
                with trio.CancelScope(shield=True), trio.move_on_after(self.stop_within):
                    await ended.wait()
                if not ended.is_set():
                    # Whatever holds a stop this long is named (a server's SIGTERM, say).
                    log.warning(
                        "%s: %r had not ended %g s after its cancel; left to the loop",
                        self.name, fn, self.stop_within,
                    )  # fmt: skip
        task = started[0]
        if task.cancelled():
            raise CallCancelled(f"{self.name}: the call was cancelled on its loop")
        error = task.exception()
        if error is not None:
            raise error
        return task.result()

    async def run(self, what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """`call` for long-running work WHAT: a failure is logged with its traceback,
        then raised here. A cancellation (either side's) is not a failure."""
        return await self.call(_logging_failure, what, fn, *args)

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """Call the plain function FN(*ARGS) on the loop, without waiting (from any thread)."""
        loop = self._loop
        if loop is None:
            raise PortalClosed(f"{self.name}: its event loop is not running")
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            raise PortalClosed(f"{self.name}: its event loop has stopped") from None


async def _call(fn: Callable[..., Awaitable[T]], args: tuple[Any, ...]) -> T:
    # Every call's coroutine on the loop: tests/test_jobs_reconnect.py delays it here, as a
    # busy loop would, to inject its fault.
    return await fn(*args)


async def _logging_failure(what: str, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
    try:
        return await fn(*args)
    except Exception:
        log.exception("%s failed", what)
        raise


@contextlib.asynccontextmanager
async def asyncio_portal(name: str, *, stop_within: float = STOP_WITHIN) -> AsyncIterator[Portal]:
    """A thread named NAME running an asyncio loop for this block; see the module."""
    portal = Portal(name, stop_within)
    ready = threading.Event()
    thread = threading.Thread(target=_thread_main, args=(portal, ready), name=name, daemon=True)
    thread.start()
    try:
        # Starting a loop takes a moment; the wait is abandoned if we are cancelled.
        await trio.to_thread.run_sync(ready.wait, abandon_on_cancel=True)
        if portal._loop is None:
            raise PortalClosed(f"{name}: its event loop did not start")
        yield portal
    except BaseException:
        # Leaving with an error (a cancellation, say): a stuck thread is logged only, so
        # that error is what the caller sees.
        with trio.CancelScope(shield=True):
            await _stop(portal, thread, stop_within, raise_if_stuck=False)
        raise
    with trio.CancelScope(shield=True):
        await _stop(portal, thread, stop_within, raise_if_stuck=True)


def _thread_main(portal: Portal, ready: threading.Event) -> None:
    loop = asyncio.new_event_loop()
    try:
        asyncio.set_event_loop(loop)
        portal._loop = loop
        loop.call_soon(ready.set)
        loop.run_forever()
        # Stopped by _stop once its tasks ended; what async generators and the default
        # executor (asyncio.to_thread) still hold ends here, still within the bound.
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.run_until_complete(loop.shutdown_default_executor())
    except BaseException:
        log.exception("%s: its event loop failed", portal.name)
    finally:
        portal._loop = None
        loop.close()
        ready.set()


async def _cancel_all_then_stop() -> None:
    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks(loop) if t is not me]
    for task in tasks:
        task.cancel()
    try:
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        loop.stop()


async def _stop(
    portal: Portal, thread: threading.Thread, stop_within: float, *, raise_if_stuck: bool
) -> None:
    loop = portal._loop
    if loop is not None:
        with contextlib.suppress(RuntimeError):  # closed already: the thread is ending
            asyncio.run_coroutine_threadsafe(_cancel_all_then_stop(), loop)
    with trio.move_on_after(stop_within):
        await trio.to_thread.run_sync(thread.join, abandon_on_cancel=True)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident or -1)
        stack = "".join(traceback.format_stack(frame)) if frame is not None else "(unknown)\n"
        log.error(
            "%s: its asyncio thread did not stop within %g s; left behind. It is at:\n%s",
            portal.name,
            stop_within,
            stack.rstrip(),
        )
        if raise_if_stuck:
            raise PortalStuck(
                f"{portal.name}: its asyncio thread did not stop within {stop_within:g} s"
            )


# --- asyncio to Trio ---------------------------------------------------------------------


class TrioPortal:
    """Calls into the Trio run that made it, from asyncio code; see the module."""

    def __init__(self, name: str, *, stop_within: float = STOP_WITHIN) -> None:
        self.name = name
        self.stop_within = stop_within
        # RuntimeError outside a Trio run: it calls into the run it was made in.
        self._token = trio.lowlevel.current_trio_token()

    async def call(self, fn: Callable[..., Awaitable[T]], *args: Any, within: float) -> T:
        """`await FN(*ARGS)` in the Trio run, within WITHIN seconds; its result, or its
        exception, here (on an asyncio loop). Cancelled here, the Trio task is cancelled
        and waited for within STOP_WITHIN."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        crossing = _Crossing()

        def begin() -> None:  # in Trio's thread
            crossing.scope = trio.CancelScope(deadline=trio.current_time() + within)
            try:
                trio.lowlevel.spawn_system_task(
                    self._in_trio, crossing, fn, args, within, answer, name=f"{self.name}: {fn!r}"
                )
            except RuntimeError:  # the run is in its final cleanup: it takes no new task
                _set_exception_soon(answer, PortalClosed(f"{self.name}: its Trio run is ending"))

        try:
            self._token.run_sync_soon(begin)
        except trio.RunFinishedError:
            raise PortalClosed(f"{self.name}: its Trio run has ended") from None
        try:
            return await asyncio.shield(answer)
        except asyncio.CancelledError:
            # Cancelled here: the Trio task is cancelled too, and waited for (its
            # `finally` runs to its end), as the other direction waits for its task.
            with contextlib.suppress(trio.RunFinishedError):  # ended: so has the task
                self._token.run_sync_soon(crossing.cancel)  # after `begin`: FIFO
            with contextlib.suppress(Exception):  # its outcome is nobody's now
                await asyncio.wait_for(asyncio.shield(answer), self.stop_within)
            raise

    async def _in_trio(
        self,
        crossing: _Crossing,
        fn: Callable[..., Awaitable[T]],
        args: tuple[Any, ...],
        within: float,
        answer: asyncio.Future[T],
    ) -> None:
        # A system task: whatever it raises would end the run, so all goes to ANSWER.
        assert crossing.scope is not None
        try:
            with crossing.scope:
                set_result_soon(answer, await fn(*args))
                return
        except Exception as e:
            _set_exception_soon(answer, e)
            return
        except BaseException:  # the run is ending: its system tasks are cancelled
            _set_exception_soon(answer, CallCancelled(f"{self.name}: the Trio run is ending"))
            raise
        # The scope caught its own cancellation: the caller's, or the deadline.
        _set_exception_soon(
            answer,
            CallCancelled(f"{self.name}: the call was cancelled")
            if crossing.cancelled
            else TimeoutError(f"{self.name}: {fn!r} did not end within {within:g} s"),
        )

    async def call_sync(self, fn: Callable[..., T], *args: Any, within: float) -> T:
        """FN(*ARGS) in Trio's thread; its result, or its exception, here (on an asyncio
        loop, which runs on meanwhile). Not run if Trio has not taken it within WITHIN
        seconds (TimeoutError) or if cancelled here before."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        crossing = _Crossing()

        def in_trio() -> None:
            if crossing.cancelled:
                return
            try:
                value = fn(*args)
            except Exception as e:
                _set_exception_soon(answer, e)
            else:
                set_result_soon(answer, value)

        try:
            self._token.run_sync_soon(in_trio)
        except trio.RunFinishedError:
            raise PortalClosed(f"{self.name}: its Trio run has ended") from None
        try:
            return await asyncio.wait_for(answer, within)
        except TimeoutError:
            crossing.cancelled = True
            raise TimeoutError(
                f"{self.name}: Trio did not take {fn!r} within {within:g} s"
            ) from None
        except asyncio.CancelledError:
            crossing.cancelled = True
            raise

    def call_soon(self, fn: Callable[..., object], *args: Any) -> None:
        """FN(*ARGS) in Trio's thread soon, without waiting, from any thread; nothing once
        the run has ended. Its failure is logged."""
        with contextlib.suppress(trio.RunFinishedError):
            self._token.run_sync_soon(self._logging_failure, fn, args)

    def _logging_failure(self, fn: Callable[..., object], args: tuple[Any, ...]) -> None:
        try:
            fn(*args)
        except Exception:  # raised here, it would end the Trio run
            log.exception("%s: %r failed in Trio", self.name, fn)


class _Crossing:
    """One call into Trio: whether its caller gave it up, and (for `call`) its Trio task's
    scope. Written from both threads, a field each time (the GIL keeps each whole); the
    scope is read and cancelled in Trio's thread only."""

    def __init__(self) -> None:
        self.cancelled = False
        self.scope: trio.CancelScope | None = None

    def cancel(self) -> None:  # in Trio's thread
        self.cancelled = True
        if self.scope is not None:
            self.scope.cancel()


def set_result_soon(future: asyncio.Future[T], value: T) -> None:
    """Settle FUTURE with VALUE on its loop, from any thread; nothing if it is done by then
    (given up) or its loop has closed (nobody waits)."""
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(_set_result, future, value)


def _set_exception_soon(future: asyncio.Future[Any], error: BaseException) -> None:
    with contextlib.suppress(RuntimeError):
        future.get_loop().call_soon_threadsafe(_set_exception, future, error)


def _set_result(future: asyncio.Future[T], value: T) -> None:
    if not future.done():
        future.set_result(value)


def _set_exception(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
