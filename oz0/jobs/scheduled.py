"""The workflow a schedule's action starts, one per run: it makes the run's job and runs it.

A Temporal Schedule (schedule_calls.py) starts `oz0.scheduled` in the tenant's namespace
on JOBS_QUEUE, so any server's job worker carries it. In one step (`oz0.schedules.start_run`,
idempotent by this run's workflow ID and run ID) it makes the job's row, then runs the
job's own workflow as its child, with the job's ID: the run lasts as long as the job, so
the schedule's overlap policy sees it running (`skip` starts no second one meanwhile), and
`cancel-other` cancelling the run cancels the job. A job that does not succeed fails the
run, which is what `--pause-on-failure` pauses on.

Only temporalio, the standard library and the job workflow are imported here (the sandbox).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError

from oz0.jobs.workflow import (
    JOBS_QUEUE,
    STEP,
    STEP_RETRY,
    Finish,
    JobInput,
    JobWorkflow,
)

WORKFLOW = "oz0.scheduled"
START_RUN = "oz0.schedules.start_run"
# The run's failure when its job ended otherwise than succeeded.
JOB_DID_NOT_SUCCEED = "JobDidNotSucceed"


@dataclass
class RunStarted:
    """The run's job (None: the schedule is gone, nothing runs)."""

    job: JobInput | None = None


@workflow.defn(name=WORKFLOW)
class ScheduledWorkflow:
    @workflow.run
    async def run(self, schedule_id: str) -> str:
        info = workflow.info()
        started: RunStarted = await workflow.execute_activity(
            START_RUN,
            args=[schedule_id, f"{info.workflow_id}/{info.run_id}"],
            task_queue=JOBS_QUEUE,
            result_type=RunStarted,
            start_to_close_timeout=STEP,
            retry_policy=STEP_RETRY,
        )
        job = started.job
        if job is None:
            return "no schedule"
        try:
            child = await workflow.start_child_workflow(
                JobWorkflow.run,
                job,
                id=job.job_id,
                task_queue=JOBS_QUEUE,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                # Should the run end first (terminated), its job is cancelled, not left.
                parent_close_policy=workflow.ParentClosePolicy.REQUEST_CANCEL,
            )
        except asyncio.CancelledError:
            # Cancelled (cancel-other) before its job's workflow began: the job ends here,
            # else its row would wait for a workflow nobody starts.
            await workflow.execute_activity(
                "oz0.jobs.finish",
                Finish(job.job_id, "cancelled", None, "cancelled before it started"),
                task_queue=JOBS_QUEUE,
                start_to_close_timeout=STEP,
                retry_policy=STEP_RETRY,
                cancellation_type=workflow.ActivityCancellationType.ABANDON,
            )
            raise
        state = await child
        if state != "succeeded":
            raise ApplicationError(
                f"job {job.job_id} {state}", type=JOB_DID_NOT_SUCCEED, non_retryable=True
            )
        return f"job {job.job_id} {state}"
