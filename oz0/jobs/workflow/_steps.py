"""The workflow's steps that touch the database (activities.py runs them), as it calls
them: local activities or activities on JOBS_QUEUE (JobInput.local_steps), retried for as
long as the database is away; and how a step is run to its end through a cancellation
(`whole`, `unstoppable`), so that a job's end never depends on when one came."""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._values import JOBS_QUEUE, AttemptEnd, JobInput

T = TypeVar("T")

STEP = dt.timedelta(seconds=10)
# The database's outages are waited out: a step retried for as long as it takes.
STEP_RETRY = RetryPolicy(
    initial_interval=dt.timedelta(seconds=0.5), maximum_interval=dt.timedelta(seconds=5)
)


async def record_end(job: JobInput, end: AttemptEnd, *, cancelled: bool = False) -> EndReason:
    """Record END. CANCELLED: the attempt's node activity was just asked to stop; that
    request reaches Temporal (and the node) only with the workflow task that made it,
    which a local activity would hold open until it ends (and the steps after it, up to
    the job's finish): recorded as an ordinary activity instead, the request goes out
    at once, with it. Its answer is the end recorded (the first one, if it had ended)."""
    because: EndReason = await step(
        "oz0.jobs.end_attempt", end, result_type=EndReason, local=job.local_steps and not cancelled
    )
    return because


async def whole(job: JobInput, work: Awaitable[T]) -> tuple[T, bool]:
    """WORK (recording an attempt's end) run to its end even if the job is cancelled
    meanwhile, and whether it was: the caller decides, once the end is recorded, whether
    the cancellation still matters. A cancellation must not be decided by when it came
    during the steps that end a job: the workflow task that ran them and completes the
    workflow is refused when an event (this cancellation) came meanwhile, and run again
    with the cancellation first, its steps again (local activities), and it must end the
    job the same way. Workflows whose steps are activities cancel the step (as ever)."""
    if not job.local_steps:
        return await work, False
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():  # the worker tears the workflow down (eviction)
                raise
            cancelled = True


async def unstoppable(work: Awaitable[T]) -> T:
    """WORK, run to its end even if the job is cancelled meanwhile (too late to matter):
    cancelled, a step is given up, and a job whose end is never recorded runs forever."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the worker tears the workflow down (eviction)
                raise


# RESULT_TYPE: a type, or a union of types (temporalio converts to either).
async def step(name: str, *args: object, result_type: Any = None, local: bool = False) -> Any:
    """A step that touches the database, on the servers' job workers: a local activity of
    the worker running the workflow if LOCAL (the job's local_steps), else an activity
    on JOBS_QUEUE."""
    if local:
        return await workflow.execute_local_activity(
            name,
            args=list(args),
            result_type=result_type,
            start_to_close_timeout=STEP,
            retry_policy=STEP_RETRY,
        )
    return await workflow.execute_activity(
        name,
        args=list(args),
        task_queue=JOBS_QUEUE,
        result_type=result_type,
        start_to_close_timeout=STEP,
        retry_policy=STEP_RETRY,
    )
