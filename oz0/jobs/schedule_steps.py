"""The schedule run's step that touches the database (scheduled.py), run by every server's
job worker beside the job workflow's steps (activities.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0.jobs import inputs, schedules, store
from oz0.jobs.scheduled import START_RUN, RunStarted
from oz0.jobs.spec import JobError
from oz0.store.pool import Database

# The run's failure when its job cannot be made (its tenant's queue is full, its node is
# no longer the tenant's): the run fails, and a schedule that pauses on failure pauses.
JOB_NOT_MADE = "JobNotMade"


class ScheduleSteps:
    def __init__(self, db: Database) -> None:
        self.db = db

    @activity.defn(name=START_RUN)
    async def start_run(self, schedule_id: str, run_key: str) -> RunStarted:
        """The run's job, made once whatever the retries (schedules.start_run)."""

        def work(conn: store.Conn) -> RunStarted:
            job = schedules.start_run(conn, schedule_id, run_key)
            if job is None:
                return RunStarted(None)
            runs = inputs.everywhere(conn)
            [job] = inputs.streaming(conn, [job], runs)
            return RunStarted(inputs.job_input(job, runs))

        try:
            return await asyncio.to_thread(self.db.transaction_in_thread, work)
        except JobError as e:
            raise ApplicationError(str(e), type=JOB_NOT_MADE, non_retryable=True) from None

    def all(self) -> list[Callable[..., Any]]:
        return [self.start_run]
