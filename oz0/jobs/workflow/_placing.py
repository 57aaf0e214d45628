"""Waiting for a node: a placing step tried again, queued, until it names one, with a
pause that grows the longer the job waits (`queued_pause`), up to the job's queue timeout;
and `Ended`, how any of the ways to run a job says that the job cannot go on."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

from oz0.jobs.workflow._values import JobInput, Placed

# While no node can take the job: look again after 1 s, doubling up to QUEUED_POLL_MAX;
# once it has waited QUEUED_PATIENT, after a tenth of its wait so far, up to
# QUEUED_POLL_LONGEST (reached at 5 minutes), so that thousands of queued jobs do not ask
# the database every 5 s (`queued_pause`). A workflow whose history has no QUEUED_BACKOFF
# marker (begun by a release without this backoff) keeps the 5 s its history was made with.
QUEUED_POLL_FIRST, QUEUED_POLL_MAX = 1.0, 5.0
QUEUED_PATIENT, QUEUED_POLL_LONGEST, QUEUED_SHARE = 60.0, 30.0, 0.1
QUEUED_BACKOFF = "oz0-queued-backoff"


class Ended(Exception):
    """The job cannot go on: STATE, with REASON (and the exit code, if any)."""

    def __init__(self, state: str, reason: str | None, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.exit_code = state, reason, exit_code


async def until_placed(
    job: JobInput, place: Callable[[], Awaitable[list[Placed]]], too_long: str
) -> list[Placed]:
    """PLACE until it names a node; between tries the job waits queued (`queued_pause`)
    until its queue timeout fails it with TOO_LONG and the last reason."""
    waited, delay = 0.0, QUEUED_POLL_FIRST
    # A marker in the history: replaying a workflow from before the backoff, this is False
    # and its timers are the ones it started; every workflow after it waits longer.
    backs_off = workflow.patched(QUEUED_BACKOFF)
    while True:
        placed = await place()
        if placed[0].ended:
            raise Ended("cancelled", "cancelled by an operator")
        if placed[0].node is not None:
            return placed
        if waited >= job.queue_timeout:
            raise Ended("failed", f"{too_long}: {placed[0].reason}")
        pause = min(queued_pause(waited, delay) if backs_off else delay, job.queue_timeout - waited)
        await workflow.sleep(pause)
        waited += pause
        delay = min(2 * delay, QUEUED_POLL_MAX)


def queued_pause(waited: float, delay: float) -> float:
    """How long a job that has waited WAITED seconds for a node waits before it looks again:
    DELAY (1 s doubling up to QUEUED_POLL_MAX) for its first QUEUED_PATIENT, as responsive as
    ever; then a tenth (QUEUED_SHARE) of its wait so far, from QUEUED_POLL_MAX up to
    QUEUED_POLL_LONGEST."""
    if waited < QUEUED_PATIENT:
        return delay
    return min(QUEUED_POLL_LONGEST, max(QUEUED_POLL_MAX, waited * QUEUED_SHARE))
