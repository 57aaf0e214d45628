"""A schedule's Temporal side: its Temporal Schedule in the tenant's namespace, with the same
ID as its row (schedules.py). Temporal decides when it runs and whether it is paused; each
function here is one call, made with a client of that namespace on the server's own
connection (the job role's, JobsRole.in_namespace).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Required, TypedDict

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.service import RPCError, RPCStatusCode

from oz0.jobs import schedules
from oz0.jobs.scheduled import ScheduledWorkflow
from oz0.jobs.workflow import JOBS_QUEUE

# How long the API waits for one of these calls.
CALL_WITHIN = 10.0


OVERLAP_POLICIES = {
    "skip": ScheduleOverlapPolicy.SKIP,
    "buffer-one": ScheduleOverlapPolicy.BUFFER_ONE,
    "allow": ScheduleOverlapPolicy.ALLOW_ALL,
    "cancel-other": ScheduleOverlapPolicy.CANCEL_OTHER,
}
NEXT_TIMES = 5


def schedule_of(schedule_id: str, spec: schedules.ScheduleSpec) -> Schedule:
    """The Temporal Schedule of SPEC: its action starts ScheduledWorkflow with the
    schedule's ID (each run's workflow ID is that ID and the time it was due)."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            ScheduledWorkflow.run, schedule_id, id=schedule_id, task_queue=JOBS_QUEUE
        ),
        spec=ScheduleSpec(
            cron_expressions=[spec.cron] if spec.cron is not None else [],
            intervals=(
                [ScheduleIntervalSpec(every=dt.timedelta(seconds=spec.every))]
                if spec.every is not None
                else []
            ),
            time_zone_name=spec.timezone,
        ),
        policy=SchedulePolicy(
            overlap=OVERLAP_POLICIES[spec.overlap],
            catchup_window=dt.timedelta(seconds=spec.catchup_window),
            pause_on_failure=spec.pause_on_failure,
        ),
        state=ScheduleState(note=f"orchestrator-zero schedule of tenant {spec.tenant}"),
    )


async def create(client: Client, schedule_id: str, spec: schedules.ScheduleSpec) -> None:
    """Make the Temporal Schedule; ScheduleError with Temporal's reason if it refuses the
    spec (a cron expression or a time zone it cannot read)."""
    try:
        await client.create_schedule(schedule_id, schedule_of(schedule_id, spec))
    except RPCError as e:
        if e.status == RPCStatusCode.INVALID_ARGUMENT:
            raise schedules.ScheduleError(f"Temporal refused {spec.when()}: {e.message}") from None
        raise


class TimingJson(TypedDict, total=False):
    """A schedule's state in Temporal; only `found` when Temporal has none."""

    found: Required[bool]
    paused: bool
    note: str | None
    next_times: list[str]
    running: int
    actions: int
    skipped_overlap: int
    missed_catchup: int


@dataclass(frozen=True)
class Timing:
    """What Temporal says of a schedule now."""

    found: bool
    paused: bool = False
    note: str | None = None
    next_times: tuple[dt.datetime, ...] = ()
    running: tuple[str, ...] = ()  # the runs' workflow IDs
    actions: int = 0
    skipped_overlap: int = 0
    missed_catchup: int = 0

    def to_json(self) -> TimingJson:
        if not self.found:
            return {"found": False}
        return {
            "found": True,
            "paused": self.paused,
            "note": self.note,
            "next_times": [t.isoformat() for t in self.next_times],
            "running": len(self.running),
            "actions": self.actions,
            "skipped_overlap": self.skipped_overlap,
            "missed_catchup": self.missed_catchup,
        }


async def describe(client: Client, schedule_id: str) -> Timing:
    """Its state, next times and counts; `found` False if Temporal has no such schedule
    (made by a server that died between its row and its Temporal Schedule)."""
    try:
        described = await client.get_schedule_handle(schedule_id).describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            return Timing(found=False)
        raise
    info, state = described.info, described.schedule.state
    return Timing(
        found=True,
        paused=state.paused,
        note=state.note,
        # Temporal lists them paused too; none of them comes while it stays paused.
        next_times=() if state.paused else tuple(info.next_action_times[:NEXT_TIMES]),
        running=tuple(getattr(r, "workflow_id", "") for r in info.running_actions),
        actions=info.num_actions,
        skipped_overlap=info.num_actions_skipped_overlap,
        missed_catchup=info.num_actions_missed_catchup_window,
    )


async def pause(client: Client, schedule_id: str, note: str) -> None:
    await client.get_schedule_handle(schedule_id).pause(note=note)


async def unpause(client: Client, schedule_id: str, note: str) -> None:
    await client.get_schedule_handle(schedule_id).unpause(note=note)


async def trigger(client: Client, schedule_id: str) -> None:
    """One run now, under the schedule's own overlap policy (a `skip` schedule whose run
    still runs starts none)."""
    await client.get_schedule_handle(schedule_id).trigger()


async def delete(client: Client, schedule_id: str) -> None:
    """Delete it; one Temporal no longer has is deleted already. Runs under way go on."""
    try:
        await client.get_schedule_handle(schedule_id).delete()
    except RPCError as e:
        if e.status != RPCStatusCode.NOT_FOUND:
            raise
