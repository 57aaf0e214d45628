"""The job workflow's check of its attempts that no node has been heard of yet
(workflow.JobInput.watch_heard): an attempt Temporal counted started but dropped on the
way to its node (oz0_common/attempt_heartbeat.py) is failed by ID a few seconds after its
start, so that the workflow gives it to its node again then, not after the whole
lost-after (15 s by default) that its heartbeat timeout would take.

Temporal is asked, not the database: the workflow's own description (its pending
activities, their state, start and heartbeat details) is the record of what Temporal
handed out and what a node said of it. An activity failed here that its node did hear of
after all (its first heartbeat later than AFTER) costs nothing but the redelivery: the node
starts nothing for an attempt it runs already (oz0_node/jobs/attempt.py, `given_again`),
and the edge completes the activity of the same ID when the attempt ends."""

from __future__ import annotations

import datetime as dt
import logging

from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from oz0.jobs.workflow import CHECK_HEARD, UNHEARD, Heard

log = logging.getLogger(__name__)


def verdict(pending: PendingActivityInfo | None, now: dt.datetime, after: float) -> str:
    """What PENDING (attempt-N's pending activity, None if it has none) says (Heard):
    HEARD (a heartbeat with details: its node has it), WAITING (in its node's queue, or
    started less than AFTER seconds ago), FAILED (to be failed: started AFTER ago and not a
    heartbeat), or GONE (ended: the workflow hears how on its own)."""
    if pending is None:
        return Heard.GONE
    if pending.heartbeat_details.payloads:
        return Heard.HEARD
    if pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
        return Heard.WAITING
    started = pending.last_started_time.ToDatetime(dt.UTC)
    return Heard.FAILED if (now - started).total_seconds() >= after else Heard.WAITING


@activity.defn(name=CHECK_HEARD)
async def check_heard(job_id: str, run_id: str, numbers: list[int], after: float) -> dict[str, str]:
    """For each attempt in NUMBERS, what its activity `attempt-N` in the job's workflow run
    says (`verdict`); those started AFTER seconds ago with no heartbeat are failed by ID
    (UNHEARD) first. Run again, it asks again: what it failed is GONE or given again."""
    client = activity.client()
    description = await client.workflow_service.describe_workflow_execution(
        DescribeWorkflowExecutionRequest(
            namespace=client.namespace,
            execution=WorkflowExecution(workflow_id=job_id, run_id=run_id),
        )
    )
    pending = {p.activity_id: p for p in description.pending_activities}
    now = dt.datetime.now(dt.UTC)
    said: dict[str, str] = {}
    for number in numbers:
        said[str(number)] = verdict(pending.get(f"attempt-{number}"), now, after)
        if said[str(number)] == Heard.FAILED:
            said[str(number)] = await _fail(client, job_id, run_id, number, after)
    return said


async def _fail(client: Client, job_id: str, run_id: str, number: int, after: float) -> str:
    handle = client.get_async_activity_handle(
        workflow_id=job_id, run_id=run_id, activity_id=f"attempt-{number}"
    )
    try:
        await handle.fail(
            ApplicationError(
                f"attempt {number}: Temporal handed it out {after:g} s ago and its node has "
                "not said it has it",
                type=UNHEARD,
                non_retryable=True,
            )
        )
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
        return Heard.GONE  # it ended meanwhile
    log.warning("job %s attempt %d: no node heard of it within %g s; given again", job_id,
                number, after)  # fmt: skip
    return Heard.FAILED
