"""Small changes that arrive together, written in one transaction.

Fifty operators' `node block` requests at once are fifty transactions: fifty worker
thread hand-offs, pool check-outs and commits, each waiting its turn on the server's one
thread. A `Batches` runs them in one task instead: while it writes one batch, the changes
that arrive wait and make the next (at most MAX_BATCH). The first change of a batch waits
only while other tasks of the server can run and changes keep coming (GATHER at most): the
rest of its burst, being parsed on the same thread, then comes with it; on a quiet server
it is written at once, as is a whole batch waiting. WRITERS batches may be written at
once: one gathers while the others write, so the last requests of a burst, parsed just
after its batch was taken, are not left waiting for that batch's commit (100-140 ms with
one writer, while three servers fan out the first batch).

A change may refuse (raise one of the REFUSALS given, e.g. NodeError) only before it
writes anything, so a refusal leaves the batch's transaction as it was and the others go
on. A batch is written by TOGETHER if given (e.g. `nodes.write_changes`, a few statements
for the whole batch), else each change in turn. Any other error aborts the transaction:
each change of that batch is then written again in a transaction of its own, so one
change's failure (a deadlock between two servers' batches, say) is its own and not its
neighbours'.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import trio

# The function trio.testing names, from where trio defines it: trio.testing imports pytest
# wherever that is installed, 0.1-0.15 CPU-seconds more for each of the ~190 servers the test
# suite starts (more wall time on a loaded machine), and nothing else of it is used here
# (tests/test_batches.py).
from trio._core import wait_all_tasks_blocked  # type: ignore[attr-defined]

from oz0.store.pool import Conn, Database

T = TypeVar("T")
W = TypeVar("W")
# A batch's changes in, each one's (result, refusal) out.
Together = Callable[[Conn, list[Any]], Sequence[tuple[Any, BaseException | None]]]

MAX_BATCH = 64
# Batches written at once: one more than the one a burst makes, for its stragglers.
WRITERS = 2
# The longest a batch's first change waits for the server's other runnable tasks (requests
# being parsed that will join it) before the batch is written...
GATHER = 0.01
# ...and how long without a change arriving ends that wait: on a server busy with thousands
# of streams some task is nearly always runnable, and a lone block waited all of GATHER.
QUIET = 0.002
# Changes waiting for a batch, beyond which a new one waits to be queued.
QUEUE = 1024


async def next_batch(
    receive: trio.MemoryReceiveChannel[W], max_batch: int, first: list[W] | None = None
) -> list[W]:
    """FIRST if given, else the next to arrive; then what waits already, MAX_BATCH at most."""
    batch = first or [await receive.receive()]
    while len(batch) < max_batch:
        try:
            batch.append(receive.receive_nowait())
        except trio.WouldBlock:
            break
    return batch


async def _while_others_run(receive: trio.MemoryReceiveChannel[Any], longest: float) -> None:
    """Let the other tasks run until none is runnable, until no change has come to RECEIVE
    for QUIET seconds, or for LONGEST seconds.

    A burst's requests reach the batcher one by one over tens of milliseconds, each parsed
    in turn on this thread. Written at once, the first of them makes a batch of its own
    whose worker thread waits for the interpreter's lock between each of its statements
    while the others are parsed (25-36 ms for a few changes, 10 ms for fifty on a quiet
    server), and the rest wait for it. Once nothing else is runnable, they are all here.

    "Nothing runnable" is the run loop's own judgement (`wait_all_tasks_blocked`: no task
    runnable, and none woken by I/O that is ready, at a turn's end). Counting the run queue
    from inside a turn is not: Trio empties it as a turn begins, so a task that runs first in
    its turn sees the queue empty while the rest of the turn has yet to run.
    """
    with trio.move_on_after(longest):
        async with trio.open_nursery() as nursery:

            async def all_blocked() -> None:
                await wait_all_tasks_blocked()
                nursery.cancel_scope.cancel()

            async def quiet() -> None:
                queued = receive.statistics().current_buffer_used
                while True:
                    await trio.sleep(QUIET)
                    now = receive.statistics().current_buffer_used
                    if now == queued:
                        nursery.cancel_scope.cancel()
                    queued = now

            nursery.start_soon(all_blocked)
            nursery.start_soon(quiet)


@dataclass(eq=False)
class _Waiting(Generic[T]):
    work: Callable[[Conn], T]
    done: trio.Event = field(default_factory=trio.Event)
    result: T | None = None
    failed: BaseException | None = None

    def finish(self, result: T | None = None, failed: BaseException | None = None) -> None:
        self.result, self.failed = result, failed
        self.done.set()


class Batches:
    def __init__(
        self,
        db: Database,
        refusals: tuple[type[Exception], ...],
        *,
        max_batch: int = MAX_BATCH,
        together: Together | None = None,
        writers: int = WRITERS,
    ) -> None:
        self._db = db
        self._refusals = refusals
        self._max_batch = max_batch
        self._together = together
        self._writers = writers
        self._send, self._receive = trio.open_memory_channel[_Waiting[Any]](QUEUE)
        # Held while a writer takes its batch, so a burst is one batch and not one per writer.
        self._gathering = trio.Lock()
        self._running = False

    async def run(self, work: Callable[[Conn], T]) -> T:
        """WORK(conn)'s result, written with the changes that came with it; raises what
        WORK raised, or what its transaction did. Until `serve` runs, a transaction of
        its own."""
        if not self._running:
            return await self._db.transaction(work)
        waiting = _Waiting(work)
        await self._send.send(waiting)
        await waiting.done.wait()
        if waiting.failed is not None:
            raise waiting.failed
        return waiting.result  # type: ignore[return-value]

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._running = True
        try:
            async with trio.open_nursery() as writers:
                for _ in range(self._writers):
                    writers.start_soon(self._writer)
                task_status.started()
        finally:
            self._running = False

    async def _writer(self) -> None:
        while True:
            async with self._gathering:
                first = await self._receive.receive()
                if self._receive.statistics().current_buffer_used < self._max_batch - 1:
                    # The rest of its burst may be on its way.
                    await _while_others_run(self._receive, GATHER)
                batch = await next_batch(self._receive, self._max_batch, [first])
            await self._write(batch)

    async def _write(self, batch: list[_Waiting[Any]]) -> None:
        refusals, write_together = self._refusals, self._together

        def together(conn: Conn) -> list[tuple[Any, BaseException | None]]:
            if write_together is not None:
                return list(write_together(conn, [w.work for w in batch]))
            outcomes: list[tuple[Any, BaseException | None]] = []
            for w in batch:
                try:
                    outcomes.append((w.work(conn), None))
                except refusals as e:
                    outcomes.append((None, e))
            return outcomes

        try:
            outcomes = await self._db.transaction(together)
        except Exception as e:
            if len(batch) == 1:
                batch[0].finish(failed=e)
                return
            for w in batch:
                await self._alone(w)
            return
        for w, (result, failed) in zip(batch, outcomes, strict=True):
            w.finish(result, failed)

    async def _alone(self, w: _Waiting[Any]) -> None:
        try:
            w.finish(await self._db.transaction(w.work))
        except Exception as e:
            w.finish(failed=e)
