"""A job run once, on one node: each attempt placed on a node (the first one maybe by the
server that started the workflow: JobInput.first), moved to another when its node is taken
away or lost (at most MAX_MOVES times, never under `--no-move`), retried after a failure
(`retries`), until it succeeds, fails, or is lost."""

from __future__ import annotations

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._attempts import attempt
from oz0.jobs.workflow._placing import until_placed
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import step
from oz0.jobs.workflow._values import STOPPED, JobInput, Outcome, Placed

# Moves do not count against `retries`; this many at most.
MAX_MOVES = 20


async def once(run: JobState, job: JobInput) -> tuple[str, int | None, str | None]:
    tried: list[str] = []
    failures = moves = 0
    first = job.first if job.first is not None and job.first.node is not None else None
    while True:
        if first is not None:
            placed, first = first, None
            run.number = placed.number
        else:
            placed = await place(run, job, tried)
        assert placed.node is not None
        outcome = await attempt(run, job, placed)
        if outcome.because == EndReason.EXIT and outcome.exit_code == 0:
            return "succeeded", 0, None
        if outcome.refusal is not None:
            return "failed", None, outcome.refusal
        if outcome.lost is not None and job.on_lost == "fail":
            return "lost", None, lost(outcome.lost, placed, job)
        if outcome.cancelled:
            return "cancelled", None, "cancelled by an operator"
        tried.append(placed.node)
        if outcome.moved:
            if job.no_move:
                return "lost", None, f"attempt {placed.number}: {outcome.because} (--no-move)"
            moves += 1
            if moves > MAX_MOVES:
                return "lost", None, f"moved {MAX_MOVES} times; last: {outcome.because}"
            continue
        failures += 1
        if failures > job.retries:
            return "failed", outcome.exit_code, failed(outcome, job)


async def place(run: JobState, job: JobInput, tried: list[str]) -> Placed:
    """The next attempt's node; waits (queued) while none can take it."""
    run.number += 1
    number = run.number

    async def placing() -> list[Placed]:
        return [
            await step(
                "oz0.jobs.place", job.job_id, number, 0, tried,
                result_type=Placed, local=job.local_steps,
            )
        ]  # fmt: skip

    [placed] = await until_placed(
        job,
        placing,
        f"no node took the job within its queue timeout of {job.queue_timeout:g} s",
    )
    return placed


def failed(outcome: Outcome, job: JobInput) -> str:
    if outcome.because == EndReason.TIMEOUT:
        return f"timed out after {job.timeout:g} s"
    return f"exited with {outcome.exit_code}"


def lost(how: str, placed: Placed, job: JobInput) -> str:
    """The reason of a job ended lost by `--on-lost fail`."""
    if how == STOPPED:
        return (
            f"node {placed.node} stopped attempt {placed.number} before its end"
            " (--on-lost fail: not run again)"
        )
    return f"node {placed.node} was lost for more than {job.lost_after_s:g} s (--on-lost fail)"
