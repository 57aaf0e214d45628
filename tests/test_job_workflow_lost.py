"""The job workflow's decisions on attempts whose node stops, is lost or never heard of
them (`--on-lost`), its steps as local activities, and a late result, run by a real
Temporal (one server on 127.0.0.196, the module's own: the files of the job workflow's
tests share the address, so they run one after another).

The workflow runs in a test worker in a namespace of the tests' own with fake database
steps and fake nodes (fixtures/job_workflow_fakes.py), there only to inject faults;
Temporal, its timeouts, cancellations and signals are real.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from temporalio import activity
from temporalio.worker import Replayer

from fixtures.job_workflow_fakes import (
    SERVER,
    Attempt,
    Behaviour,
    FakeFleet,
    Result,
    exits,
    grant_of,
    hangs,
    job_input,
    never_heard,
    operator,
    result_of,
    stops,
    workflow_running,
)
from fixtures.temporal import Credentials, run_async
from oz0.jobs import workflow as wf
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow import AttemptEnd, Finish, JobWorkflow, Placed
from oz0_common.attempt_heartbeat import HEARD

__all__ = ["operator"]  # the fixture, used by name

ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)


async def falls_silent(attempt: Attempt) -> Result:
    """The agent was killed: no heartbeat, no answer."""
    await asyncio.sleep(60)
    return result_of(0)


def answers_late(release: asyncio.Event, code: int) -> Behaviour:
    """Hears nothing of a cancellation (no heartbeats) and answers once RELEASE is set."""

    async def behaviour(attempt: Attempt) -> Result:
        await release.wait()
        return result_of(code)

    return behaviour


def test_a_node_stopping_ends_the_attempt_for_the_store_to_say_why_and_moves_it(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": stops, "b": exits(0)})
    fleet.gone = "node purged"
    job = job_input(retries=0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert fleet.ran("a") == [1] and fleet.ran("b") == [2]
        # No reason from the workflow: the store derives it from what became of the node;
        # the node's words kept beside it.
        assert fleet.ends == [
            AttemptEnd(job.job_id, 1, None, None, detail="the node's runtime is stopping"),
            AttemptEnd(job.job_id, 2, EndReason.EXIT, 0),
        ]
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


@pytest.mark.parametrize("on_lost", ["move", "wait"])
def test_a_lost_node_s_attempt_is_moved_once_its_lost_after_passes_with_move_or_wait(
    operator: Credentials, on_lost: str
) -> None:
    fleet = FakeFleet({"a": falls_silent, "b": exits(0)})
    fleet.gone = "node lost"
    job = job_input(retries=0, on_lost=on_lost, lost_after=1.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert fleet.ran("a") == [1] and fleet.ran("b") == [2]
        assert fleet.ends == [
            AttemptEnd(job.job_id, 1, None, None),
            AttemptEnd(job.job_id, 2, EndReason.EXIT, 0),
        ]

    run_async(scenario)


def test_a_first_attempt_placed_before_the_workflow_is_handed_out_without_a_step(
    operator: Credentials,
) -> None:
    """The sweeper placed attempt 1 as it claimed the job (JobInput.first): the workflow's
    first task schedules it, no step before; a retry is placed by the step as ever."""
    fleet = FakeFleet({"a": [exits(1), exits(0)], "b": exits(0)})
    node = fleet.node("a")
    first = Placed(1, node, grant=grant_of(1, node))
    job = job_input(retries=1, first=first)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
            history = await j.handle.fetch_history()
        assert fleet.attempts[0].payload["grant"] == grant_of(1, node)
        assert (fleet.attempts[0].number, fleet.attempts[0].node) == (1, node)
        assert [(number, tried) for number, _, tried in fleet.places] == [(2, [node])]
        assert fleet.attempts[1].number == 2
        # Scheduled by the first workflow task, no step's marker before it (a patch's only).
        before = history.events[: kinds(history).index("activity_task_scheduled_event_attributes")]
        assert kinds(history)[: len(before)].count("workflow_task_completed_event_attributes") == 1
        markers = [
            e.marker_recorded_event_attributes.marker_name
            for e in before
            if e.HasField("marker_recorded_event_attributes")
        ]
        assert markers == ["core_patch"], markers
        assert (
            await Replayer(workflows=[JobWorkflow]).replay_workflow(history)
        ).replay_failure is None

    run_async(scenario)


@pytest.mark.parametrize("all_nodes", [False, True])
def test_an_attempt_no_node_heard_of_is_given_to_its_node_again_not_moved_nor_lost(
    operator: Credentials, all_nodes: bool
) -> None:
    fleet = FakeFleet({"a": [never_heard, exits(0)], "b": exits(0)})
    job = job_input(retries=0, on_lost="fail", lost_after=1.0, all_nodes=all_nodes)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        # The same attempt, its same input, on the same node: one attempt ended once.
        again = [a for a in fleet.attempts if a.node == fleet.node("a")]
        assert [a.number for a in again] == [1, 1]
        assert again[0].payload == again[1].payload and again[1].activity_id == "attempt-1"
        assert AttemptEnd(job.job_id, 1, EndReason.EXIT, 0) in fleet.ends
        assert len([e for e in fleet.ends if e.number == 1]) == 1

    run_async(scenario)


@pytest.mark.parametrize("all_nodes", [False, True])
def test_an_attempt_no_node_heard_of_is_given_again_within_seconds_not_after_its_lost_after(
    operator: Credentials, all_nodes: bool
) -> None:
    """Its lost-after (120 s) is past the job's bound: the workflow asks Temporal about the
    attempt HEARD_AFTER after handing it out, fails it by ID as unheard and gives it again."""
    fleet = FakeFleet({"a": [never_heard, exits(0)], "b": exits(0)})
    job = job_input(retries=0, on_lost="fail", lost_after=120.0, all_nodes=all_nodes)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
            history = await j.handle.fetch_history()
        assert fleet.ran("a") == [1, 1]
        [failure] = [
            e.activity_task_failed_event_attributes.failure
            for e in history.events
            if e.HasField("activity_task_failed_event_attributes")
        ]
        assert failure.application_failure_info.type == wf.UNHEARD, failure
        assert len([e for e in fleet.ends if e.number == 1]) == 1

    run_async(scenario)


def test_a_heard_attempt_is_not_failed_and_a_short_job_costs_one_timer(
    operator: Credentials,
) -> None:
    """An attempt that heartbeats runs on past HEARD_AFTER, asked about once; a job that
    ends sooner leaves one timer started and no check."""
    release = asyncio.Event()

    async def beats_then_exits(attempt: Attempt) -> Result:
        while not release.is_set():
            activity.heartbeat(HEARD)
            await asyncio.sleep(0.2)
        return result_of(0)

    async def scenario() -> None:
        fleet = FakeFleet({"a": beats_then_exits})
        async with workflow_running(operator, fleet, job_input()) as j:
            await asyncio.sleep(wf.HEARD_AFTER + 3)
            release.set()
            assert await j.result() == "succeeded"
            long = await j.handle.fetch_history()
        assert fleet.ran("a") == [1]
        assert kinds(long).count("timer_started_event_attributes") == 1
        fleet = FakeFleet({"a": exits(0)})
        async with workflow_running(operator, fleet, job_input()) as j:
            assert await j.result() == "succeeded"
            short = await j.handle.fetch_history()
        assert kinds(short).count("timer_started_event_attributes") == 1
        assert "marker_recorded_event_attributes" in kinds(short)  # the steps, local
        replayer = Replayer(workflows=[JobWorkflow])
        for history in (long, short):
            assert (await replayer.replay_workflow(history)).replay_failure is None

    run_async(scenario)


def kinds(history: Any) -> list[str]:
    """Each event's attributes' field name, in order."""
    return [e.WhichOneof("attributes") for e in history.events]


def test_an_attempt_never_heard_of_three_times_is_lost_as_before(operator: Credentials) -> None:
    fleet = FakeFleet({"a": never_heard, "b": exits(0)})
    fleet.gone = "node lost"
    job = job_input(retries=0, on_lost="fail", lost_after=1.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "lost"
        assert fleet.ran("a") == [1, 1, 1] and fleet.ran("b") == []

    run_async(scenario)


def test_on_lost_fail_ends_the_job_lost_when_its_node_is_lost_and_runs_it_nowhere_else(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": falls_silent, "b": exits(0)})
    fleet.gone = "node lost"
    job = job_input(retries=3, on_lost="fail", lost_after=1.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "lost"
        assert fleet.ran("a") == [1] and fleet.ran("b") == []
        assert fleet.ends == [AttemptEnd(job.job_id, 1, None, None)]
        assert fleet.finished == [
            Finish(
                job.job_id, "lost", None,
                f"node {fleet.node('a')} was lost for more than 1 s (--on-lost fail)",
            )
        ]  # fmt: skip

    run_async(scenario)


def test_on_lost_fail_does_not_run_again_what_a_stopping_node_killed(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": stops, "b": exits(0)})
    fleet.gone = "node lost"
    job = job_input(on_lost="fail")

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "lost"
        assert fleet.ran("b") == []
        assert fleet.finished[0].reason == (
            f"node {fleet.node('a')} stopped attempt 1 before its end"
            " (--on-lost fail: not run again)"
        )

    run_async(scenario)


def test_on_lost_fail_still_moves_an_attempt_off_a_blocked_node(operator: Credentials) -> None:
    fleet = FakeFleet({"a": hangs, "b": exits(0)})
    job = job_input(on_lost="fail", lost_after=60.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await fleet.started(1)
            await j.remove(1, "node blocked")
            assert await j.result() == "succeeded"
        assert fleet.ran("b") == [2]

    run_async(scenario)


@pytest.mark.parametrize(
    ("on_lost", "lost_after", "seconds"),
    [("move", None, 15), ("wait", None, 600), ("fail", None, 15), ("wait", 42.0, 42)],
)
def test_each_attempt_is_activity_attempt_n_lost_after_its_job_s_lost_after(
    operator: Credentials, on_lost: str, lost_after: float | None, seconds: int
) -> None:
    fleet = FakeFleet({"a": [exits(1), exits(0)]})
    job = job_input(retries=1, on_lost=on_lost, lost_after=lost_after)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert [a.activity_id for a in fleet.attempts] == ["attempt-1", "attempt-2"]
        timeout = dt.timedelta(seconds=seconds)
        assert [a.heartbeat_timeout for a in fleet.attempts] == [timeout, timeout]

    run_async(scenario)


def step_kinds(history: Any) -> tuple[list[str], int]:
    """The activities a history scheduled on the servers' queue (JOBS_QUEUE) by type, and
    how many local activities it recorded."""
    activities = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.task_queue.name == wf.JOBS_QUEUE
    ]
    local = [
        e
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_local_activity"
    ]
    return activities, len(local)


def test_the_steps_are_local_activities_and_a_history_of_activity_steps_replays(
    operator: Credentials,
) -> None:
    """A job's database steps are local activities of the worker running it: no activity
    task on the servers' queue. A job started without local_steps (by a server while one of
    an older release was up, or before this release) has them as activities; both
    histories replay."""
    steps = ["oz0.jobs.place", "oz0.jobs.end_attempt"] * 2 + ["oz0.jobs.finish"]

    async def one_job(local_steps: bool) -> Any:
        fleet = FakeFleet({"a": [exits(1), exits(0)]})
        async with workflow_running(
            operator, fleet, job_input(retries=1, local_steps=local_steps)
        ) as j:
            assert await j.result() == "succeeded"
            return await j.handle.fetch_history()

    async def scenario() -> None:
        local, activities = await one_job(True), await one_job(False)
        assert step_kinds(local) == ([], len(steps))
        assert step_kinds(activities) == (steps, 0)
        replayer = Replayer(workflows=[JobWorkflow])
        for history in (local, activities):
            replayed = await replayer.replay_workflow(history)
            assert replayed.replay_failure is None

    run_async(scenario)


def test_a_late_result_from_a_node_the_job_moved_away_from_is_ignored(
    operator: Credentials,
) -> None:
    release = asyncio.Event()
    fleet = FakeFleet({"a": answers_late(release, 0), "b": exits(4)})
    job = job_input(retries=0)

    async def b_waits_for_the_late_answer(attempt: Attempt) -> Result:
        await fleet.attempt(1).answered.wait()
        await asyncio.sleep(0.5)  # the late answer reaches the workflow first
        return result_of(4)

    fleet.behaviours[fleet.node("b")] = b_waits_for_the_late_answer

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await fleet.started(1)
            await j.remove(1, "node purged")
            await fleet.started(2)
            release.set()  # node a says its attempt exited 0, after the move
            assert await j.result() == "failed"
        assert fleet.attempt(1).answered.is_set() and not fleet.attempt(1).cancelled.is_set()
        assert fleet.ends == [
            AttemptEnd(job.job_id, 1, EndReason.NODE_PURGED, None),
            AttemptEnd(job.job_id, 2, EndReason.EXIT, 4),
        ]
        assert fleet.finished == [Finish(job.job_id, "failed", 4, "exited with 4")]

    run_async(scenario)
