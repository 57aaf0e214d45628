"""The interval loop of the edge's bounded audit trails (join_refusals.py,
attempt_refusals.py): what went over budget in an interval is written as a summary at its
end, and once more when the edge stops."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import psycopg
import trio

log = logging.getLogger(__name__)

# At the stop, how long the last summary may wait for the database.
FLUSH_AT_STOP = 2.0


async def flush_every(
    every: float,
    flush: Callable[[], Awaitable[None]],
    what: str,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """FLUSH every EVERY seconds until cancelled, then once more if the database lets us
    in time. A database error leaves what FLUSH keeps for the next interval (an outage
    must not end the edge); WHAT names the summary in the log line that says so."""
    task_status.started()
    try:
        while True:
            await trio.sleep(every)
            await _flush_or_keep(flush, what)
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(FLUSH_AT_STOP):
            await _flush_or_keep(flush, what)


async def _flush_or_keep(flush: Callable[[], Awaitable[None]], what: str) -> None:
    try:
        await flush()
    except psycopg.Error as e:
        log.warning("cannot write the summary of %s yet: %s", what, e)
