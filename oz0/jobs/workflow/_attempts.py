"""One attempt, from its handing out to its end recorded: as the node's activity
`oz0.job.attempt` on the node's own task queue (a streamed one is _streamed.py's), how
its end is read (the command's exit or timeout, the node's refusal, its node taken away,
lost or stopping), and the look for attempts no node has heard of (`watch_heard`)."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    TimeoutError,
    TimeoutType,
)

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import record_end, step, whole
from oz0.jobs.workflow._streamed import streamed
from oz0.jobs.workflow._values import (
    ATTEMPT_REFUSED,
    CHECK_HEARD,
    LOST,
    NODE_ACTIVITY,
    NODE_STOPPING,
    RECORD_UNWRITABLE,
    SECRETS_UNREADABLE,
    STOPPED,
    UNHEARD,
    AttemptEnd,
    Heard,
    JobInput,
    Outcome,
    Placed,
    schedule_to_start,
)

# Workflows started before attempts had IDs of their own heartbeat on the node's own
# Temporal connection and are lost after HEARTBEAT_TIMEOUT; from ATTEMPT_BY_ID on, each
# attempt is the activity `attempt-N`, heartbeated by ID by the server its node streams
# to, and lost after the job's lost-after (JobInput.lost_after_s).
HEARTBEAT_TIMEOUT = dt.timedelta(seconds=10)
ATTEMPT_BY_ID = "oz0-attempt-by-id"
# An attempt whose activity timed out with no heartbeat at all (no node heard of it) is
# given to its node again, at most REDELIVER_MAX times (`unheard`); histories from before
# (no REDELIVER marker) end it lost, as they did.
REDELIVER, REDELIVER_MAX = "oz0-redeliver-unheard", 2
# With JobInput.watch_heard, the workflow asks Temporal (CHECK_HEARD, heard.py) about each
# attempt HEARD_AFTER seconds after handing it out, and every HEARD_AFTER while it waits in
# its node's queue: one started that long ago with no heartbeat yet is failed by ID
# (UNHEARD) and so given again at once, not after the attempt's lost-after.
# An attempt still in its node's queue is asked about at most HEARD_CHECKS times (a long
# queue costs no more events than that): its heartbeat timeout is the sign after.
HEARD_AFTER, HEARD_CHECKS = 5.0, 3
# No job timeout: heartbeats alone keep the attempt honest.
NO_TIMEOUT = dt.timedelta(days=365)
TIMEOUT_MARGIN = dt.timedelta(seconds=60)
# The most of a node's words kept as an attempt's detail (as a streamed failure's message:
# oz0_common/attempt_messages.py MAX_FAILURE_MESSAGE; the workflow imports no oz0_common).
MAX_DETAIL = 4 * 1024


async def attempt(run: JobState, job: JobInput, placed: Placed) -> Outcome:
    """Run PLACED's attempt on its node (with the grant its placement signed and the
    secrets it sealed to that node) until it ends, its node is taken away, or the job
    is cancelled; its end is recorded before this returns."""
    if placed.streamed:
        return await streamed(run, job, placed)
    number, node = placed.number, placed.node
    assert node is not None
    timeout = job.timeout
    given: dict[str, Any] = {
        "job_id": job.job_id,
        "attempt": number,
        "command": job.command,
        "env": job.env,
        "timeout": timeout,
        "grant": placed.grant,
    }
    if job.limits:  # only when asked: an older node ignores what it does not know
        given["limits"] = job.limits
    if placed.secrets:  # one opaque string, as the node protocol has it
        given["secrets"] = placed.secrets
    # Replayed, a history from before attempts had IDs of their own keeps its own.
    by_id = workflow.patched(ATTEMPT_BY_ID)
    handle = node_activity(job, given, node, by_id=by_id)
    if by_id:
        watch(run, job, number)
    try:
        return await attempt_ends(run, job, placed, given, handle, by_id)
    finally:
        run.unconfirmed.pop(number, None)


async def attempt_ends(
    run: JobState,
    job: JobInput,
    placed: Placed,
    given: dict[str, Any],
    handle: workflow.ActivityHandle[dict[str, Any]],
    by_id: bool,
) -> Outcome:
    """How PLACED's activity HANDLE (its input GIVEN) ends, recorded: what the node says,
    its node taken away, or given again while no node heard of it."""
    number, node = placed.number, placed.node
    assert node is not None
    removal = asyncio.create_task(workflow.wait_condition(lambda: number in run.removed))
    # A cancellation that comes with the node's answer (in the same workflow task) is
    # too late for the attempt: its answer stands, recorded as `whole` records it.
    late = False
    times = 1
    while True:
        try:
            await workflow.wait([handle, removal], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            late = handle.done() and job.local_steps
            if not late:
                handle.cancel()
                removal.cancel()
                with contextlib.suppress(ActivityError, asyncio.CancelledError):
                    await handle  # its cancellation, heard (else temporalio logs it lost)
                await record_end(
                    job, AttemptEnd(job.job_id, number, EndReason.CANCELLED, None), cancelled=True
                )
                raise
        if not handle.done():
            # Taken away: whatever the node says later is not heard.
            handle.cancel()
            with contextlib.suppress(ActivityError, asyncio.CancelledError):
                await handle
            because = await record_end(
                job, AttemptEnd(job.job_id, number, run.removed[number], None), cancelled=True
            )
            return Outcome(because, None)
        # Lost on the way (oz0_common/attempt_heartbeat.py): not a node lost, the same
        # attempt (its grant, its activity ID) given to it again, a bounded number of
        # times; a node that runs it already starts nothing (its end completes this
        # activity), and its record of what it ran refuses one it had run and reported.
        if not (
            by_id and times <= REDELIVER_MAX and not late and unheard(handle)
            and workflow.patched(REDELIVER)
        ):  # fmt: skip
            break
        times += 1
        workflow.logger.warning(
            "job %s attempt %d: no node heard of it; given to %s again",
            job.job_id, number, node,
        )  # fmt: skip
        handle = node_activity(job, given, node, by_id=by_id)
        watch(run, job, number)
    removal.cancel()
    try:
        result = handle.result()
    except ActivityError as e:
        refused = refusal(e)
        if refused is not None:
            because, later = await whole(
                job, record_end(job, AttemptEnd(job.job_id, number, EndReason.REFUSED, None))
            )
            return Outcome(
                because, None, f"node {node} refused attempt {number}: {refused}",
                cancelled=late or later,
            )  # fmt: skip
        end = AttemptEnd(job.job_id, number, failure_because(e, job), None, detail=node_detail(e))
        because, later = await whole(job, record_end(job, end))
        return Outcome(because, None, lost=lost_how(e), cancelled=late or later)
    # The node's own word for how its command ended: "exit", "timeout" (or "stopped").
    ended_because = (
        EndReason.TIMEOUT if result.get("ended_because") == "timeout" else EndReason.EXIT
    )
    exit_code = result.get("exit_code")
    code = exit_code if isinstance(exit_code, int) else None
    applied = result.get("applied")
    because, later = await whole(
        job,
        record_end(
            job,
            AttemptEnd(
                job.job_id, number, ended_because, code,
                applied if isinstance(applied, dict) else None,
            )
        )
    )  # fmt: skip
    return Outcome(because, code, cancelled=late or later)


def node_activity(
    job: JobInput, given: dict[str, Any], node: str, *, by_id: bool
) -> workflow.ActivityHandle[dict[str, Any]]:
    """The activity of the attempt GIVEN, on NODE's queue."""
    timeout = job.timeout
    return workflow.start_activity(
        NODE_ACTIVITY,
        given,
        activity_id=f"attempt-{given['attempt']}" if by_id else None,
        task_queue=node,
        schedule_to_start_timeout=schedule_to_start(job.all_nodes, job.queue_timeout),
        start_to_close_timeout=(
            dt.timedelta(seconds=timeout) + TIMEOUT_MARGIN if timeout else NO_TIMEOUT
        ),
        heartbeat_timeout=(dt.timedelta(seconds=job.lost_after_s) if by_id else HEARTBEAT_TIMEOUT),
        retry_policy=RetryPolicy(maximum_attempts=1),
        cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
        result_type=dict,
    )


def unheard(handle: workflow.ActivityHandle[dict[str, Any]]) -> bool:
    """Whether HANDLE's activity timed out on its heartbeat with no heartbeat ever, or was
    failed as UNHEARD (`watch_heard`): its task never reached a node
    (oz0_common/attempt_heartbeat.py)."""
    if handle.cancelled():
        return False
    error = handle.exception()
    if not isinstance(error, ActivityError):
        return False
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type == UNHEARD:
        return True
    return (
        isinstance(cause, TimeoutError)
        and cause.type == TimeoutType.HEARTBEAT
        and not cause.last_heartbeat_details
    )


def failure_because(error: ActivityError, job: JobInput) -> EndReason | None:
    """Why the node's activity failed: the job's own timeout, the node's own trouble it
    named, or None when only what became of the node can tell (its runtime stopped, it fell
    silent, it never took the attempt)."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.START_TO_CLOSE:
        return EndReason.TIMEOUT
    if isinstance(cause, ApplicationError) and cause.type == SECRETS_UNREADABLE:
        return EndReason.NODE_COULD_NOT_READ_SECRETS  # a move: placed again, sealed again
    if isinstance(cause, ApplicationError) and cause.type == RECORD_UNWRITABLE and job.unrecorded:
        return EndReason.NODE_COULD_NOT_RECORD  # a move: its disk full, say
    return None


def node_detail(error: ActivityError) -> str | None:
    """The node's own words on why it failed the attempt (its ApplicationError's message),
    bounded; None when the node said nothing (a timeout, a cancellation, UNHEARD)."""
    cause = error.cause
    if not isinstance(cause, ApplicationError) or cause.type == UNHEARD or not cause.message:
        return None
    return cause.message[:MAX_DETAIL]


def lost_how(error: ActivityError) -> str | None:
    """LOST if no heartbeat reached Temporal for the attempt's heartbeat timeout (its node
    was connected to no server, or its attempt gone from it); STOPPED if the node killed
    the command as its runtime stopped; else None."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT:
        return LOST
    if isinstance(cause, ApplicationError) and cause.type == UNHEARD:
        return LOST  # as its heartbeat timeout would have, only sooner
    if isinstance(cause, ApplicationError) and cause.type == NODE_STOPPING:
        return STOPPED
    return None


def refusal(error: ActivityError) -> str | None:
    """The node's reason, if it refused the attempt (its grant did not hold there)."""
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type == ATTEMPT_REFUSED:
        return cause.message
    return None


# --- attempts no node heard of ---------------------------------------------------------


def watch(run: JobState, job: JobInput, number: int) -> None:
    """Attempt NUMBER was just handed out: looked for within HEARD_AFTER."""
    if not job.watch_heard:
        return
    run.unconfirmed[number] = 0
    if run.watcher is None:
        run.watcher = asyncio.create_task(watch_heard(run, job))


async def watch_heard(run: JobState, job: JobInput) -> None:
    """While some attempt is unconfirmed: HEARD_AFTER later, ask Temporal about each
    (CHECK_HEARD, which fails by ID those started that long ago with no heartbeat: the
    attempt's own wait in `attempt_ends` then gives it again). One timer and one step for
    all the job's parts; none at all after the job ends within HEARD_AFTER."""
    run_id = workflow.info().run_id
    while True:
        await workflow.wait_condition(lambda: bool(run.unconfirmed))
        await workflow.sleep(HEARD_AFTER)
        asked = sorted(run.unconfirmed)
        if not asked:
            continue
        run.checking = True
        try:
            said: dict[str, str] = await step(
                CHECK_HEARD, job.job_id, run_id, asked, HEARD_AFTER,
                result_type=dict[str, str], local=job.local_steps,
            )  # fmt: skip
        finally:
            run.checking = False
        for n in asked:
            if n not in run.unconfirmed:
                continue  # ended meanwhile
            run.unconfirmed[n] += 1
            if said.get(str(n)) == Heard.HEARD or run.unconfirmed[n] >= HEARD_CHECKS:
                del run.unconfirmed[n]
