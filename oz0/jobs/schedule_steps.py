"""The schedule run's step that touches the database (scheduled.py), run by every server's
job worker beside the job workflow's steps (activities.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from oz0.jobs import inputs, schedule_calls, schedules, store
from oz0.jobs.schedule_owners import Held
from oz0.jobs.scheduled import START_RUN, RunStarted
from oz0.jobs.spec import JobError
from oz0.store.pool import Database

# The run's failure when its job cannot be made (its tenant's queue is full, its node is
# no longer the tenant's): the run fails, and a schedule that pauses on failure pauses.
JOB_NOT_MADE = "JobNotMade"
# How long a run of a schedule paused for its owner tries to pause its Temporal Schedule.
PAUSE_WITHIN = 5.0

log = logging.getLogger(__name__)


class ScheduleSteps:
    def __init__(self, db: Database) -> None:
        self.db = db

    @activity.defn(name=START_RUN)
    async def start_run(self, schedule_id: str, run_key: str) -> RunStarted:
        """The run's job, made once whatever the retries (schedules.start_run)."""

        def work(conn: store.Conn) -> RunStarted | Held:
            job = schedules.start_run(conn, schedule_id, run_key)
            if job is None or isinstance(job, Held):
                return job or RunStarted(None)
            runs = inputs.everywhere(conn)
            [job] = inputs.streaming(conn, [job], runs)
            return RunStarted(inputs.job_input(job, runs))

        try:
            started = await asyncio.to_thread(self.db.transaction_in_thread, work)
        except JobError as e:
            raise ApplicationError(str(e), type=JOB_NOT_MADE, non_retryable=True) from None
        if isinstance(started, Held):
            # Its owner may no longer run it: no job, and its Temporal Schedule stops too
            # (the server that paused the row pauses it as well; this is for when that
            # server could not, or the pause was found here).
            await _pause(started)
            return RunStarted(None)
        return started

    def all(self) -> list[Callable[..., Any]]:
        return [self.start_run]


async def _pause(held: Held) -> None:
    """Pause HELD's Temporal Schedule, with its reason as the note, on the worker's own
    client (of the schedule's tenant namespace); a failure is logged (the next run tries
    again, and starts nothing meanwhile)."""
    try:
        await asyncio.wait_for(
            schedule_calls.pause(activity.client(), held.schedule_id, held.note), PAUSE_WITHIN
        )
    except (RPCError, TimeoutError) as e:
        log.warning("schedule %s: could not pause it in Temporal: %s", held.schedule_id, e)
