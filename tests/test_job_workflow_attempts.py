"""The job workflow's decisions on one command's attempts: success, limits, retries
elsewhere, refusals, timeouts, and moves off removed nodes (capped), run by a real
Temporal (one server on 127.0.0.196, the module's own: the files of the job workflow's
tests share the address, so they run one after another).

The workflow runs in a test worker in a namespace of the tests' own with fake database
steps and fake nodes (fixtures/job_workflow_fakes.py), there only to inject faults;
Temporal, its timeouts, cancellations and signals are real.
"""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from fixtures.job_workflow_fakes import (
    SERVER,
    Attempt,
    FakeFleet,
    Result,
    exits,
    grant_of,
    hangs,
    job_input,
    operator,
    result_of,
    stops,
    workflow_running,
)
from fixtures.polling import asyncio_until
from fixtures.temporal import Credentials, run_async
from oz0.jobs import workflow as wf
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow import AttemptEnd, Finish, _once

__all__ = ["operator"]  # the fixture, used by name

ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)


# --- one command ------------------------------------------------------------------------


def test_exit_0_succeeds(operator: Credentials) -> None:
    fleet = FakeFleet({"a": exits(0)})
    job = job_input(command=["sh", "-c", "exit 0"], env={"K": "V"}, timeout=30.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        [attempt] = fleet.attempts
        assert attempt.node == fleet.node("a")
        assert attempt.payload == {
            "job_id": job.job_id,
            "attempt": 1,
            "command": ["sh", "-c", "exit 0"],
            "env": {"K": "V"},
            "timeout": 30.0,
            "grant": grant_of(1, fleet.node("a")),
        }
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.EXIT, 0)]
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


def test_limits_reach_every_attempt_and_what_the_node_applied_is_recorded(
    operator: Credentials,
) -> None:
    limits = {"memory": 512 << 20, "cpu": 0.5, "max_open_files": 1024}
    applied = {
        "user": "oz0-job",
        "tracking": "cgroup v2",
        "limits": {"memory": "cgroup v1", "max_open_files": "rlimit", "cpu": "not applied"},
    }

    async def applies(attempt: Attempt) -> Result:
        return {**result_of(3), "applied": applied}

    # The second node is an older agent: it says nothing of what it applied.
    fleet = FakeFleet({"a": applies, "b": exits(0)})
    job = job_input(limits=limits, retries=1)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert [(a.number, a.payload["limits"]) for a in fleet.attempts] == [
            (1, limits),
            (2, limits),
        ]
        assert fleet.ends == [
            AttemptEnd(job.job_id, 1, EndReason.EXIT, 3, applied),
            AttemptEnd(job.job_id, 2, EndReason.EXIT, 0, None),
        ]

    run_async(scenario)


def test_a_failing_command_is_retried_elsewhere_first_then_fails_with_its_exit_code(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(3), "b": exits(3)})
    job = job_input(retries=2)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        a, b = fleet.node("a"), fleet.node("b")
        # Three attempts; each placement is told the nodes already tried (placed last).
        assert [(n, tried) for n, _, tried in fleet.places] == [(1, []), (2, [a]), (3, [a, b])]
        assert fleet.ran("a") == [1, 3] and fleet.ran("b") == [2]
        assert [(e.number, e.because, e.exit_code) for e in fleet.ends] == [
            (1, "exit", 3),
            (2, "exit", 3),
            (3, "exit", 3),
        ]
        assert fleet.finished == [Finish(job.job_id, "failed", 3, "exited with 3")]

    run_async(scenario)


async def refuses(attempt: Attempt) -> Result:
    """What a node does with an attempt whose grant does not hold there."""
    raise ApplicationError(
        f"job {attempt.payload['job_id']} attempt {attempt.number}: the grant expired 9 s ago",
        type=wf.ATTEMPT_REFUSED,
        non_retryable=True,
    )


def test_an_attempt_its_node_refuses_fails_the_job_at_once_neither_retried_nor_moved(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": refuses, "b": exits(0)})
    job = job_input(retries=3)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        a = fleet.node("a")
        assert fleet.ran("a") == [1] and fleet.ran("b") == []
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.REFUSED, None)]
        why = f"node {a} refused attempt 1: job {job.job_id} attempt 1: the grant expired 9 s ago"
        assert fleet.finished == [Finish(job.job_id, "failed", None, why)]

    run_async(scenario)


def test_all_nodes_a_refused_part_is_not_retried_and_the_job_says_which_node_refused(
    operator: Credentials,
) -> None:
    fleet = FakeFleet({"a": exits(0), "b": refuses})
    job = job_input(all_nodes=True, retries=2)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        b = fleet.node("b")
        assert fleet.ran("b") == [2] and fleet.places_on == []
        assert fleet.attempt(2).payload["grant"] == grant_of(2, b)
        [finish] = fleet.finished
        assert finish.reason == (
            f"1 of 2 nodes failed (node {b} refused attempt 2: job {job.job_id} attempt 2:"
            " the grant expired 9 s ago)"
        )

    run_async(scenario)


def test_a_command_timing_out_fails_the_job(operator: Credentials) -> None:
    async def times_out(attempt: Attempt) -> Result:
        return {**result_of(0), "exit_code": None, "ended_because": "timeout"}

    fleet = FakeFleet({"a": times_out})
    job = job_input(timeout=5.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.TIMEOUT, None)]
        assert fleet.finished == [Finish(job.job_id, "failed", None, "timed out after 5 s")]

    run_async(scenario)


def test_a_removed_node_s_attempt_moves_without_using_up_retries(operator: Credentials) -> None:
    fleet = FakeFleet({"a": hangs, "b": exits(0)})
    fleet.finish_waits_for_nodes = True
    job = job_input(retries=0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            first = await fleet.started(1)
            await j.remove(1, "node blocked")
            assert await j.result() == "succeeded"
        # The node heard of it from the workflow (its process is to be killed).
        assert first.cancelled.is_set() and fleet.running_at_finish == []
        a = fleet.node("a")
        assert first.node == a and fleet.ran("b") == [2]
        assert [(n, tried) for n, _, tried in fleet.places] == [(1, []), (2, [a])]
        assert fleet.ends == [
            AttemptEnd(job.job_id, 1, EndReason.NODE_BLOCKED, None),
            AttemptEnd(job.job_id, 2, EndReason.EXIT, 0),
        ]
        assert fleet.finished == [Finish(job.job_id, "succeeded", 0, None)]

    run_async(scenario)


def test_no_move_makes_a_removed_node_s_attempt_end_the_job_lost(operator: Credentials) -> None:
    fleet = FakeFleet({"a": hangs, "b": exits(0)})
    fleet.finish_waits_for_nodes = True
    job = job_input(no_move=True, retries=3)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            first = await fleet.started(1)
            await j.remove(1, "node purged")
            assert await j.result() == "lost"
        assert first.cancelled.is_set() and fleet.running_at_finish == []
        assert len(fleet.places) == 1 and fleet.ran("b") == []
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.NODE_PURGED, None)]
        assert fleet.finished == [
            Finish(job.job_id, "lost", None, "attempt 1: node purged (--no-move)")
        ]

    run_async(scenario)


def test_moves_are_capped(operator: Credentials, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_once, "MAX_MOVES", 2)
    fleet = FakeFleet({"a": hangs, "b": hangs, "c": hangs})
    fleet.finish_waits_for_nodes = True
    job = job_input(retries=5)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job, patched=True) as j:
            # Take every attempt's node away as it starts, a few more times than the cap.
            for number in range(1, 6):
                ended = asyncio.ensure_future(j.result())
                started = asyncio.ensure_future(fleet.started(number))
                await asyncio.wait([ended, started], return_when=asyncio.FIRST_COMPLETED)
                if ended.done():
                    started.cancel()
                    break
                ended.cancel()
                await j.remove(number, "node blocked")
            assert await j.result() == "lost"
        # The first attempt and two moves; the third move is one too many.
        assert [a.number for a in fleet.attempts] == [1, 2, 3]
        assert all(a.cancelled.is_set() for a in fleet.attempts)
        assert fleet.running_at_finish == []
        assert [(e.number, e.because) for e in fleet.ends] == [
            (1, "node blocked"),
            (2, "node blocked"),
            (3, "node blocked"),
        ]
        assert fleet.finished == [
            Finish(job.job_id, "lost", None, "moved 2 times; last: node blocked")
        ]

    run_async(scenario)


def test_a_job_whose_nodes_keep_going_away_ends_lost_after_20_moves(
    operator: Credentials,
) -> None:
    # The workflow as the servers run it (the module's own MAX_MOVES, the default
    # sandbox): every attempt's node stops at once, so each attempt is a move.
    fleet = FakeFleet({"a": stops, "b": stops})
    job = job_input(retries=0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            ended = asyncio.ensure_future(j.handle.result())
            # 21 rounds of three steps each: more than JOB_BOUND on a loaded machine. A
            # 22nd attempt fails the test at once rather than at the bound.
            await asyncio_until(
                lambda: ended.done() or len(fleet.attempts) > 21, 120, "the end", step=0.05
            )
            assert ended.done(), f"attempt {len(fleet.attempts)} started: no cap at 20 moves"
            assert ended.result() == "lost"
        # The first attempt and the 20 moves the docs promise; the next is one too many.
        assert len(fleet.attempts) == 1 + 20
        assert fleet.finished == [
            Finish(job.job_id, "lost", None, "moved 20 times; last: node blocked")
        ]

    run_async(scenario)
