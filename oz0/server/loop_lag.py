"""How late the server's one Trio thread wakes a task: what every stream and request waits.

A task sleeps EVERY seconds and records by how much it overslept. Anything that holds the
thread (a busy loop over streams, a long garbage collection, a blocking call) shows here
as lag, whichever task caused it.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

EVERY = 0.5


async def watch(
    record: Callable[[float], None],
    *,
    every: float = EVERY,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call RECORD(seconds late) after each sleep of EVERY, until cancelled."""
    task_status.started()
    while True:
        slept_at = trio.current_time()
        await trio.sleep(every)
        record(max(0.0, trio.current_time() - slept_at - every))
