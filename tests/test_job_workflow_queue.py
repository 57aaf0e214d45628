"""The job workflow's decisions on a queued job, a cancelled one, a job on every node
(`--all`) and a job's secrets, run by a real Temporal (one server on 127.0.0.196, the
module's own: the files of the job workflow's tests share the address, so they run one
after another).

The workflow runs in a test worker in a namespace of the tests' own with fake database
steps and fake nodes (fixtures/job_workflow_fakes.py), there only to inject faults;
Temporal, its timeouts, cancellations and signals are real.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from fixtures.job_workflow_fakes import (
    SEEN_BOUND,
    SERVER,
    WHY_QUEUED,
    Attempt,
    Behaviour,
    FakeFleet,
    Result,
    exits,
    grant_of,
    hangs,
    job_input,
    operator,
    result_of,
    workflow_running,
)
from fixtures.polling import asyncio_until
from fixtures.temporal import Credentials, run_async
from oz0.jobs import workflow as wf
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow import AttemptEnd, Finish, JobWorkflow, _placing
from oz0_common.attempt_heartbeat import HEARD

__all__ = ["operator"]  # the fixture, used by name

ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)


def together(barrier: Callable[[], bool], code: int) -> Behaviour:
    """Exits with CODE once BARRIER holds (every part has started), 99 if it never does."""

    async def behaviour(attempt: Attempt) -> Result:
        deadline = time.monotonic() + SEEN_BOUND
        while not barrier():
            if time.monotonic() > deadline:
                return result_of(99)
            activity.heartbeat(HEARD)
            await asyncio.sleep(0.05)
        return result_of(code)

    return behaviour


# --- queued, cancelled ------------------------------------------------------------------


def test_no_node_within_the_queue_timeout_fails_the_job_with_the_reason(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.queued_for = 1000
    job = job_input(queue_timeout=1.5)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        assert len(fleet.places) >= 2 and all(n == 1 for n, _, _ in fleet.places)
        assert fleet.attempts == [] and fleet.ends == []
        assert fleet.finished == [
            Finish(
                job.job_id,
                "failed",
                None,
                f"no node took the job within its queue timeout of 1.5 s: {WHY_QUEUED}",
            )
        ]

    run_async(scenario)


def test_a_queued_job_runs_once_a_node_can_take_it(operator: Credentials) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.queued_for = 1
    job = job_input(queue_timeout=30.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert [n for n, _, _ in fleet.places] == [1, 1] and fleet.ran("a") == [1]

    run_async(scenario)


def test_a_queued_job_looks_as_often_as_before_in_its_first_minute_then_less_up_to_every_30_s() -> (
    None
):
    """The schedule alone (`queued_pause`, what the workflow sleeps between placements)."""
    looks: list[tuple[float, float]] = []  # (waited so far, pause)
    waited, delay = 0.0, wf.QUEUED_POLL_FIRST
    while waited < 3600:
        pause = wf.queued_pause(waited, delay)
        looks.append((waited, pause))
        waited += pause
        delay = min(2 * delay, wf.QUEUED_POLL_MAX)
    assert [p for w, p in looks if w < 60] == [1, 2, 4] + [5] * 11, "as before the backoff"
    later = [p for w, p in looks if w >= 60]
    assert later == sorted(later) and 5 < later[0] < 7, "longer, gradually"
    assert all(p == 30 for w, p in looks if w >= 300), "every 30 s from 5 minutes on"
    # An hour queued: about 150 looks instead of the 5 s schedule's 720.
    assert len(looks) < 160


def test_a_queued_job_backs_off_behind_a_marker_and_its_history_replays(
    operator: Credentials, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The schedule in tenths of a second, so that the backoff begins within the test:
    # 0.1 s doubling to 0.2 s until 0.5 s waited, then all of the wait so far, up to 1 s.
    for name, value in [("QUEUED_POLL_FIRST", 0.1), ("QUEUED_POLL_MAX", 0.2),
                        ("QUEUED_PATIENT", 0.5), ("QUEUED_POLL_LONGEST", 1.0),
                        ("QUEUED_SHARE", 1.0)]:  # fmt: skip
        monkeypatch.setattr(_placing, name, value)
    fleet = FakeFleet({"a": exits(0)})
    fleet.queued_for = 6
    job = job_input(queue_timeout=30.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job, patched=True) as j:
            assert await j.result() == "succeeded"
            history = await j.handle.fetch_history()
        timers = [
            e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta().total_seconds()
            for e in history.events
            if e.HasField("timer_started_event_attributes")
        ]
        # Then the one that looks for its attempt unheard, once the attempt is handed out.
        assert timers == pytest.approx([0.1, 0.2, 0.2, 0.5, 1.0, 1.0, wf.HEARD_AFTER])
        markers = [
            e.marker_recorded_event_attributes.marker_name
            for e in history.events
            if e.HasField("marker_recorded_event_attributes")
        ]
        # Its own marker among them (the attempts' activity IDs have one too).
        assert "core_patch" in markers, "workflows from before it keep their 5 s timers"
        patches = [
            e.marker_recorded_event_attributes.SerializeToString()
            for e in history.events
            if e.HasField("marker_recorded_event_attributes")
        ]
        assert any(wf.QUEUED_BACKOFF.encode() in data for data in patches), patches
        # A worker of this release replays the history it made (as after a restart).
        runner = SandboxedWorkflowRunner(
            restrictions=SandboxRestrictions.default.with_passthrough_modules(wf.__name__)
        )
        replayed = await Replayer(workflows=[JobWorkflow], workflow_runner=runner).replay_workflow(
            history
        )
        assert replayed.replay_failure is None

    run_async(scenario)


def test_cancelling_a_running_job_cancels_its_attempt(operator: Credentials) -> None:
    fleet = FakeFleet({"a": hangs, "b": exits(0)})
    fleet.finish_waits_for_nodes = True
    job = job_input(retries=3)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            first = await fleet.started(1)
            await j.handle.cancel()
            assert await j.result() == "cancelled"
        assert first.cancelled.is_set() and fleet.running_at_finish == []
        assert len(fleet.places) == 1 and fleet.ran("b") == []
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.CANCELLED, None)]
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run_async(scenario)


def test_cancelling_a_queued_job(operator: Credentials) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.queued_for = 1000
    job = job_input(queue_timeout=600.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await asyncio_until(
                lambda: len(fleet.places) >= 1, SEEN_BOUND, "a placement", step=0.05
            )
            await j.handle.cancel()
            assert await j.result() == "cancelled"
        assert fleet.attempts == [] and fleet.ends == []
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run_async(scenario)


def test_cancelling_a_job_while_it_is_being_placed(operator: Credentials) -> None:
    fleet = FakeFleet({"a": exits(0)})
    gate = fleet.place_gate = asyncio.Event()
    job = job_input()

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await asyncio.wait_for(fleet.place_entered.wait(), SEEN_BOUND)
            await j.handle.cancel()
            try:
                assert await j.result() == "cancelled"
            finally:
                gate.set()
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run_async(scenario)


def test_a_cancellation_while_the_job_s_end_is_being_recorded_does_not_lose_it(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.finish_fails = 2  # retried after 0.5 s, then 1 s
    job = job_input()

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await asyncio_until(
                lambda: fleet.finish_tries >= 1,
                SEEN_BOUND,
                "the first try to record the end",
                step=0.05,
            )
            await j.handle.cancel()  # too late: the job has ended
            assert await j.result() == "succeeded"
        # Its three tries; and once more when the workflow task that ran them, refused for
        # the cancellation that came meanwhile, is run again (its steps are local
        # activities): the job's end as the first one recorded it.
        assert fleet.finish_tries in (3, 4)
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


def test_a_job_cancelled_in_the_database_ends_at_its_next_placement(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.ended = True
    job = job_input()

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "cancelled"
        assert fleet.attempts == []
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run_async(scenario)


# --- on every node (--all) ----------------------------------------------------------------


def test_all_nodes_run_concurrently_a_removed_part_ends_lost_a_retried_part_stays(
    operator: Credentials,
) -> None:
    fleet: FakeFleet

    def all_started() -> bool:
        return {a.node for a in fleet.attempts} == set(fleet.behaviours)

    fleet = FakeFleet(
        {
            "a": together(all_started, 0),
            "b": hangs,
            "c": [together(all_started, 5), exits(0)],
        }
    )
    fleet.finish_waits_for_nodes = True
    job = job_input(all_nodes=True, retries=1)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await asyncio_until(all_started, SEEN_BOUND, "every node's part started", step=0.05)
            await j.remove(2, "node blocked")
            assert await j.result() == "lost"
        assert fleet.attempt(2).cancelled.is_set() and fleet.running_at_finish == []
        assert fleet.everywhere == [1] and fleet.places == []
        assert fleet.ran("a") == [1] and fleet.ran("b") == [2] and fleet.ran("c") == [3, 4]
        # Node c's part failed once and ran again there; node b's part was not moved.
        assert fleet.places_on == [(4, 2, fleet.node("c"))]
        assert {(e.number, e.because, e.exit_code) for e in fleet.ends} == {
            (1, "exit", 0),
            (2, "node blocked", None),
            (3, "exit", 5),
            (4, "exit", 0),
        }
        assert fleet.finished == [
            Finish(job.job_id, "lost", None, "1 of 3 nodes were lost (node blocked)")
        ]

    run_async(scenario)


def test_all_nodes_a_failed_part_fails_the_job_with_its_exit_code(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0), "b": exits(7)})
    job = job_input(all_nodes=True, retries=1)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        b = fleet.node("b")
        assert fleet.ran("a") == [1] and fleet.ran("b") == [2, 3]
        assert fleet.places_on == [(3, 1, b)]
        # The retry on its node carries the grant that placement signed for it.
        assert fleet.attempt(3).payload["grant"] == grant_of(3, b)
        assert fleet.finished == [Finish(job.job_id, "failed", 7, "1 of 2 nodes failed")]

    run_async(scenario)


def test_an_all_nodes_job_cancelled_while_its_end_is_recorded_keeps_its_verdict(
    operator: Credentials,
) -> None:
    """As for one node: the workflow task that ran the last steps is refused for the cancel
    that came meanwhile and run again with the cancel first; every part had ended, so the
    job ends as its parts decided, the same as the end first recorded."""
    fleet = FakeFleet({"a": exits(0), "b": exits(0)})
    fleet.finish_fails = 2  # retried after 0.5 s, then 1 s
    job = job_input(all_nodes=True)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await asyncio_until(
                lambda: fleet.finish_tries >= 1,
                SEEN_BOUND,
                "the first try to record the end",
                step=0.05,
            )
            await j.handle.cancel()  # too late: every part has ended
            assert await j.result() == "succeeded"
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


def test_cancelling_an_all_nodes_job_cancels_every_part(operator: Credentials) -> None:
    fleet = FakeFleet({"a": hangs, "b": hangs})
    fleet.finish_waits_for_nodes = True
    job = job_input(all_nodes=True)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await fleet.started(1)
            await fleet.started(2)
            await j.handle.cancel()
            assert await j.result() == "cancelled"
        assert all(a.cancelled.is_set() for a in fleet.attempts)
        assert fleet.running_at_finish == []
        assert {(e.number, e.because) for e in fleet.ends} == {(1, "cancelled"), (2, "cancelled")}
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run_async(scenario)


# --- secrets ------------------------------------------------------------------------------


def test_each_attempt_carries_only_the_secrets_sealed_for_it_and_its_node(
    operator: Credentials,
) -> None:
    async def unreadable(attempt: Attempt) -> Result:
        raise ApplicationError(
            "its secrets cannot be read on this node", type=wf.SECRETS_UNREADABLE,
            non_retryable=True,
        )  # fmt: skip

    fleet = FakeFleet({"a": unreadable, "b": exits(0)})
    fleet.sealed = "sealed:"
    job = job_input(env={"K": "V"}, no_move=False)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        a, b = fleet.node("a"), fleet.node("b")
        assert [x.payload["secrets"] for x in fleet.attempts] == [f"sealed:1@{a}", f"sealed:2@{b}"]
        assert all(x.payload["env"] == {"K": "V"} for x in fleet.attempts)
        # Secrets the node cannot open (its key renewed since): placed again, sealed again.
        assert fleet.ends[0] == AttemptEnd(
            job.job_id, 1, EndReason.NODE_COULD_NOT_READ_SECRETS, None,
            detail="its secrets cannot be read on this node",
        )  # fmt: skip
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


@pytest.mark.parametrize("knows", [True, False], ids=["every server knows", "an older one up"])
def test_an_attempt_its_node_could_not_record_moves_saying_so(
    operator: Credentials, knows: bool
) -> None:
    """The node's data directory full: it fails the attempt (RecordUnwritable), which
    moves. Ended `node could not record the attempt` with the node's words, not `node
    lost`; a job started while a server of the previous release was up (its workers
    would not read that reason) ends it as before, from what became of the node."""
    said = "cannot record the attempt as run in /d/attempts-run: No space left on device"

    async def full(attempt: Attempt) -> Result:
        raise ApplicationError(said, type=wf.RECORD_UNWRITABLE, non_retryable=True)

    fleet = FakeFleet({"a": full, "b": exits(0)})
    job = job_input(unrecorded=knows)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        because = EndReason.NODE_COULD_NOT_RECORD if knows else None
        assert fleet.ends[0] == AttemptEnd(job.job_id, 1, because, None, detail=said)
        assert [a.node for a in fleet.attempts] == [fleet.node("a"), fleet.node("b")]

    run_async(scenario)


def test_a_server_that_cannot_hand_the_secrets_over_fails_the_job_saying_why(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0)})
    fleet.secrets_refused = "this server does not hold the cluster's master key"
    job = job_input()

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        assert fleet.attempts == [] and len(fleet.places) == 1
        assert fleet.finished == [
            Finish(
                job.job_id, "failed", None,
                "cannot give the job's secrets to a node: this server does not hold the"
                " cluster's master key",
            )
        ]  # fmt: skip

    run_async(scenario)
