"""A job on every matching node (`--all`): one part a node, all at once, each retried on
its node and never moved (`part`, which a rolling batch's parts run too: _batches.py);
the job fails if a part failed, is lost if a part's node was taken away, else succeeds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._attempts import attempt
from oz0.jobs.workflow._placing import until_placed
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import step
from oz0.jobs.workflow._values import JobInput, Outcome, Placed


async def everywhere(run: JobState, job: JobInput) -> tuple[str, int | None, str | None]:
    async def place() -> list[Placed]:
        placed: list[Placed] = await step(
            "oz0.jobs.place_everywhere", job.job_id, 1,
            result_type=list[Placed], local=job.local_steps,
        )  # fmt: skip
        return placed

    placed = await until_placed(
        job, place, f"no node matched within the queue timeout of {job.queue_timeout:g} s"
    )
    run.number = len(placed)
    parts = [asyncio.create_task(part(run, job, p)) for p in placed]
    try:
        results = await asyncio.gather(*parts)
    except asyncio.CancelledError:
        for task in parts:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*parts, return_exceptions=True)
        # Too late if every part had ended anyway (as for one node, `_steps.whole`): the
        # workflow task run again with the cancel first must end the job the same way.
        if not (job.local_steps and all(map(ended_anyway, parts))):
            raise
        results = [task.result() for task in parts]
    failed = [r for r in results if not r.moved and r.exit_code != 0]
    lost = [r for r in results if r.moved]
    if failed:
        first = failed[0]
        why = f"{len(failed)} of {len(results)} nodes failed"
        refused = [r.refusal for r in results if r.refusal is not None]
        if refused:
            why += f" ({refused[0]})"
        return "failed", first.exit_code, why
    if lost:
        return (
            "lost",
            None,
            f"{len(lost)} of {len(results)} nodes were lost ({lost[0].because})",
        )
    return "succeeded", 0, None


async def part(run: JobState, job: JobInput, first: Placed) -> Outcome:
    """One node's part of an `--all` job: retried there, never moved."""
    assert first.node is not None
    number, failures, placed = first.number, 0, first
    while True:
        outcome = await attempt(run, job, placed)
        run.cancel_heard |= outcome.cancelled
        # A part's end as it would be without a cancellation is its end: `cancelled`
        # stays only on one that a cancellation cut short (a retry not made).
        if outcome.moved or outcome.refusal is not None:
            return dataclasses.replace(outcome, cancelled=False)
        if outcome.because == EndReason.EXIT and outcome.exit_code == 0:
            return dataclasses.replace(outcome, cancelled=False)
        failures += 1
        if failures > job.retries:
            return dataclasses.replace(outcome, cancelled=False)
        if outcome.cancelled:
            return outcome
        run.number += 1
        number = run.number
        placed = await step(
            "oz0.jobs.place_on",
            job.job_id,
            number,
            first.part,
            first.node,
            result_type=Placed,
            local=job.local_steps,
        )


def part_failed(outcome: Outcome) -> bool:
    """A part that ran and failed (not one whose node was taken away)."""
    return not outcome.moved and outcome.exit_code != 0


def ended_anyway(task: asyncio.Task[Outcome]) -> bool:
    """Whether a part's TASK ended with the part's own end, which a cancellation that came
    with it or as it was recorded did not cut short."""
    if not task.done() or task.cancelled() or task.exception() is not None:
        return False
    return not task.result().cancelled
