"""A rolling batch (`--all --batch`): the parts of an `--all` job run a few at a time
(`--batch N` or `P%` of the matching nodes, `share_of`), each slot resting `--batch-wait`
after its part ends, no new part once more than `--max-failures` have failed."""

from __future__ import annotations

import asyncio
import contextlib

from temporalio import workflow

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._everywhere import part, part_failed
from oz0.jobs.workflow._placing import Ended, until_placed
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import step
from oz0.jobs.workflow._values import JobInput, Outcome, Placed


def share_of(share: str, total: int, *, least: int) -> int:
    """SHARE ("N" or "P%", as oz0.jobs.spec_text.parse_share keeps it) of TOTAL parts, at
    least LEAST: a percentage rounds down, as Salt's `--batch 10%` does."""
    if share.endswith("%"):
        return max(least, total * int(share[:-1]) // 100)
    return max(least, int(share))


async def in_batches(run: JobState, job: JobInput) -> tuple[str, int | None, str | None]:
    """Salt's `--batch` as a sliding window: the parts (one per node matching now) are
    recorded waiting; WINDOW lanes each take the next waiting part, run it to its end,
    rest `batch_wait`, and take the next, so at most WINDOW run at once and a part
    starts as soon as one ends. Once more than `max_failures` parts have failed, no
    lane takes another; those running finish. Only workflow timers and the lanes'
    own state decide, so a replay makes the same steps."""
    assert job.batch is not None

    async def listed() -> list[Placed]:
        parts: list[Placed] = await step(
            "oz0.jobs.list_parts", job.job_id, result_type=list[Placed], local=job.local_steps
        )
        return parts

    waiting = await until_placed(
        job, listed, f"no node matched within the queue timeout of {job.queue_timeout:g} s"
    )
    total = len(waiting)
    window = share_of(job.batch, total, least=1)
    allowed = None if job.max_failures is None else share_of(job.max_failures, total, least=0)
    run.number = total  # first attempts are 1..total; retries number on from there
    results: list[Outcome] = []

    def stopped() -> bool:
        return allowed is not None and sum(map(part_failed, results)) > allowed

    async def lane() -> None:
        while waiting and not stopped() and not run.cancel_heard:
            results.append(await waited_part(run, job, waiting.pop(0)))
            if job.batch_wait > 0 and waiting and not stopped() and not run.cancel_heard:
                await workflow.sleep(job.batch_wait)

    lanes = [asyncio.create_task(lane()) for _ in range(min(window, total))]
    try:
        await asyncio.gather(*lanes)
    except BaseException as e:
        # Cancelled, or a step that failed the job: no lane goes on without the job.
        for task in lanes:
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*lanes, return_exceptions=True)
        # Too late if every part had ended anyway (as in `_everywhere.everywhere`).
        ended_anyway = (
            isinstance(e, asyncio.CancelledError) and job.local_steps and not waiting
            and all(t.done() and not t.cancelled() and t.exception() is None for t in lanes)
            and not any(r.cancelled for r in results)
        )  # fmt: skip
        if not ended_anyway:
            raise
    return verdict(results, total, len(waiting), job)


async def waited_part(run: JobState, job: JobInput, waiting: Placed) -> Outcome:
    """A part WAITING, its slot open: its first attempt placed now (grant and secrets from
    now), then run as any part; a node taken away while the part waited ends it unrun."""
    assert waiting.node is not None
    placed: Placed = await step(
        "oz0.jobs.place_part", job.job_id, waiting.number, waiting.part, waiting.node,
        result_type=Placed, local=job.local_steps,
    )  # fmt: skip
    if placed.ended:
        raise Ended("cancelled", "cancelled by an operator")
    if placed.node is None:
        # Not started: its reason is what became of its node (placement.place_part).
        gone = EndReason(placed.reason) if placed.reason else EndReason.NODE_LOST
        return Outcome(gone, None)
    return await part(run, job, placed)


def verdict(
    results: list[Outcome], total: int, not_started: int, job: JobInput
) -> tuple[str, int | None, str | None]:
    """A batch job's end from its parts' RESULTS, of TOTAL, NOT_STARTED of which never
    started (stopped by --max-failures): failed if any failed, else lost if any node was
    taken away, else succeeded."""
    failed = [r for r in results if part_failed(r)]
    lost = [r for r in results if r.moved]
    if failed:
        why = f"{len(failed)} of {total} nodes failed"
        refused = [r.refusal for r in results if r.refusal is not None]
        if refused:
            why += f" ({refused[0]})"
        if not_started:
            why += f"; {not_started} parts not started (--max-failures {job.max_failures})"
        return "failed", failed[0].exit_code, why
    if lost:
        return "lost", None, f"{len(lost)} of {total} nodes were lost ({lost[0].because})"
    return "succeeded", 0, None
