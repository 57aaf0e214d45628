"""One streamed attempt (Placed.streamed, issue 41): a row its node's edge sends over the
node's control stream, not an activity. The workflow only waits for its end, signalled
(`parts_ended`, recorded by the edge from the node's report: oz0/jobs/parts.py), or for
its node taken away or fallen silent (`node_removed`, recorded here)."""

from __future__ import annotations

import asyncio

from temporalio import workflow

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import record_end, whole
from oz0.jobs.workflow._values import (
    LOST,
    AttemptEnd,
    JobInput,
    Outcome,
    PartEnd,
    Placed,
)


async def streamed(run: JobState, job: JobInput, placed: Placed) -> Outcome:
    """PLACED's attempt, a row its node's edge sends over the control stream: until
    its end is signalled (`parts_ended`, recorded already), its node is taken away or
    lost (`node_removed`, recorded here), or the job is cancelled. No activity, no
    timer: what happens to the part happens in rows, and only its end is heard."""
    number = placed.number
    try:
        await workflow.wait_condition(lambda: number in run.ended or number in run.removed)
    except asyncio.CancelledError:
        if number in run.ended:  # its end came with the cancellation: too late for it
            return part_outcome(run.ended[number], cancelled=True)
        # The node hears of it from its edge, which reads the attempt ended so.
        await record_end(job, AttemptEnd(job.job_id, number, EndReason.CANCELLED, None))
        raise
    if number in run.ended:
        return part_outcome(run.ended[number])
    removed = run.removed[number]
    because, late = await whole(job, record_end(job, AttemptEnd(job.job_id, number, removed, None)))
    if because != removed:
        # Its node's report was recorded first (the first end stands): its signal,
        # from the edge or the sweeper, says how it ended.
        await workflow.wait_condition(lambda: number in run.ended)
        return part_outcome(run.ended[number], cancelled=late)
    return Outcome(
        because, None, lost=LOST if because == EndReason.NODE_LOST else None, cancelled=late
    )


def part_outcome(end: PartEnd, *, cancelled: bool = False) -> Outcome:
    return Outcome(end.because, end.exit_code, end.refusal, end.lost, cancelled)
