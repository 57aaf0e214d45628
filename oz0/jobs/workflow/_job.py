"""JobWorkflow, the workflow Temporal knows as WORKFLOW: its signals (`node_removed`,
`parts_ended`), which way it runs its job (_once.py, _everywhere.py, _batches.py), and the
job's end, recorded whatever happens meanwhile (`oz0.jobs.finish`)."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    is_cancelled_exception,
)

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._batches import in_batches
from oz0.jobs.workflow._everywhere import everywhere
from oz0.jobs.workflow._once import once
from oz0.jobs.workflow._placing import Ended
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import step, unstoppable
from oz0.jobs.workflow._values import (
    PARTS_ENDED,
    SECRETS_UNAVAILABLE,
    WORKFLOW,
    Finish,
    JobInput,
    PartEnd,
)


@workflow.defn(name=WORKFLOW)
class JobWorkflow:
    def __init__(self) -> None:
        self.known = JobState()

    @workflow.signal(name="node_removed")
    def node_removed(self, number: int, because: EndReason) -> None:
        self.known.removed.setdefault(number, because)

    @workflow.signal(name=PARTS_ENDED)
    def parts_ended(self, ends: list[PartEnd]) -> None:
        """Streamed attempts that ended (the edge that stored their nodes' reports, or the
        sweeper for one whose signal was lost): the first word on each stands."""
        for end in ends:
            self.known.ended.setdefault(end.number, end)

    @workflow.run
    async def run(self, job: JobInput) -> str:
        run = self.known
        try:
            if job.all_nodes and job.batch is not None:
                state, exit_code, reason = await in_batches(run, job)
            elif job.all_nodes:
                state, exit_code, reason = await everywhere(run, job)
            else:
                state, exit_code, reason = await once(run, job)
        except Ended as e:
            state, exit_code, reason = e.state, e.exit_code, e.reason
        except (asyncio.CancelledError, FailureError) as e:
            # A cancellation that comes while a step runs (placing, recording an end) is
            # that step's failure (an ActivityError; a local activity's own CancelledError
            # or ApplicationError), not an asyncio.CancelledError.
            unavailable = secrets_unavailable(e)
            if unavailable is not None:
                state, exit_code, reason = "failed", None, unavailable
            elif not is_cancelled_exception(e):
                raise
            else:
                state, exit_code, reason = "cancelled", None, "cancelled by an operator"
        if run.watcher is not None and run.checking:
            # A check under way would hold the job's last workflow task open; its answer
            # no longer matters. A watcher waiting on its timer is left: the timer goes
            # with the workflow, where cancelling it would be one more event.
            run.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, FailureError):
                await run.watcher
        finish = Finish(job.job_id, state, exit_code, reason)
        await unstoppable(step("oz0.jobs.finish", finish, local=job.local_steps))
        return state


def secrets_unavailable(error: BaseException) -> str | None:
    """The message of a placing step that could not hand the job's secrets over (an
    activity's failure has it as its cause; a local activity's is raised as it is)."""
    cause = error.cause if isinstance(error, ActivityError) else error
    if isinstance(cause, ApplicationError) and cause.type == SECRETS_UNAVAILABLE:
        return f"cannot give the job's secrets to a node: {cause.message}"
    return None
