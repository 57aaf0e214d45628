"""The job workflow's decisions, run by a real Temporal (one server on 127.0.0.196).

The workflow (`oz0.jobs.workflow.JobWorkflow`) runs in a test worker in a namespace of the
test's own (`wf-tests`, not a tenant's, so the server's own job worker leaves it alone),
with fake database steps under the names and signatures of `oz0.jobs.activities` that keep
what they were asked in memory, and fake nodes: one worker per node queue whose
`oz0.job.attempt` each test scripts (exit with N, hang until cancelled, stop as a blocked
node's runtime does, fall silent, answer late). The fakes are only there to inject those
faults; Temporal, its timeouts, cancellations and signals are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
from temporalio import activity
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions
from trio_websocket import WebSocketConnection

from cli.client import ApiClient
from fixtures import edge_client
from fixtures.cluster import Served
from fixtures.polling import asyncio_until
from fixtures.temporal import Credentials, register_namespace, run_async, server_credentials
from oz0.context import Context
from oz0.jobs import heard
from oz0.jobs import workflow as wf
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow import AttemptEnd, Finish, JobInput, JobWorkflow, Placed, _once, _placing
from oz0_common.attempt_heartbeat import HEARD
from tests.conftest import CliRunner, create_token

SERVER = "127.0.0.196"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
TEMPORAL = f"{SERVER}:7233"
NAMESPACE = "wf-tests"
# Generous bounds for a loaded 2-core machine; each is a deadline, never a measurement.
JOB_BOUND = 30.0
SEEN_BOUND = 15.0
# Below the workflow's step timeout (STEP, 10 s): a fake step that waits must not time out.
FINISH_WAIT = 8.0
# The node's worker lets a cancellation through within a second (JOBS_CONTRACT); so does ours.
HEARTBEAT_THROTTLE = dt.timedelta(seconds=1)
WHY_QUEUED = "no accepted node of tenant default matches role=gpu"

Result = dict[str, Any]
Behaviour = Callable[["Attempt"], Awaitable[Result]]


# --- the server and the namespace, once for the file ------------------------------------


@pytest.fixture(scope="module")
def operator(served: Served) -> Credentials:
    """Our own namespace in the module's one server's Temporal; credentials of Temporal's
    admin, which the test's job workers and starters need (a server's: an operator may only
    read on Temporal)."""
    creds = server_credentials(served.files)
    run_async(lambda: register_namespace(TEMPORAL, creds, NAMESPACE))
    return creds


# --- the fakes ----------------------------------------------------------------------------


@dataclass
class Attempt:
    """One call of a fake node's `oz0.job.attempt`, as the node saw it."""

    node: str
    payload: dict[str, Any]
    # Its activity's ID and heartbeat timeout, as Temporal gave them to the node.
    activity_id: str = ""
    heartbeat_timeout: dt.timedelta | None = None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def number(self) -> int:
        return int(self.payload["attempt"])


class Fleet:
    """Fake nodes (their queues), the attempts they ran, and the fake database steps."""

    def __init__(self, behaviours: dict[str, list[Behaviour] | Behaviour]) -> None:
        tag = secrets.token_hex(3)
        # Node IDs are their queues; a tag of the test's own keeps a stale task of an
        # earlier test from reaching this one's nodes.
        self.names = {short: f"node-{short}-{tag}" for short in behaviours}
        self.behaviours = {self.names[k]: v for k, v in behaviours.items()}
        self.attempts: list[Attempt] = []
        self.places: list[tuple[int, int, list[str]]] = []
        self.everywhere: list[int] = []
        self.places_on: list[tuple[int, int, str]] = []
        self.ends: list[AttemptEnd] = []
        self.recorded: dict[int, str] = {}
        self.finished: list[Finish] = []
        self.placed: dict[int, Placed] = {}
        # What the store would say became of a node whose attempt ended with no reason.
        self.gone = "node blocked"
        self.queued_for = 0  # place answers "none" to that many calls first
        self.ended = False  # the database says the job was cancelled
        self.place_gate: asyncio.Event | None = None
        self.place_entered = asyncio.Event()
        self.finish_fails = 0  # finish fails that many times first (the database is away)
        self.finish_tries = 0
        # Finish waits (a while) for the nodes to be done with their attempts, and notes
        # those still running: the node must hear of a cancellation from the workflow, not
        # only once the workflow is gone (its heartbeat then finds no activity).
        self.finish_waits_for_nodes = False
        self.running_at_finish: list[int] = []
        # The sealed secrets place hands each attempt (as the real step seals them to the
        # node), or the refusal of a server that cannot (SecretsUnavailable).
        self.sealed = ""
        self.secrets_refused: str | None = None

    def node(self, short: str) -> str:
        return self.names[short]

    def ran(self, short: str) -> list[int]:
        return [a.number for a in self.attempts if a.node == self.names[short]]

    def attempt(self, number: int) -> Attempt:
        return next(a for a in self.attempts if a.number == number)

    async def started(self, number: int) -> Attempt:
        await asyncio_until(
            lambda: any(a.number == number for a in self.attempts),
            SEEN_BOUND,
            f"attempt {number}",
            step=0.05,
        )
        return self.attempt(number)

    # The database steps: the names and signatures of oz0.jobs.activities.

    @activity.defn(name="oz0.jobs.place")
    async def place(self, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
        self.places.append((number, part, list(tried)))
        self.place_entered.set()
        if self.place_gate is not None:
            await self.place_gate.wait()
        if number in self.placed:  # a retried step: the same answer, as the store gives
            return self.placed[number]
        if self.ended:
            return Placed(number, None, ended=True)
        if self.queued_for > 0:
            self.queued_for -= 1
            return Placed(number, None, WHY_QUEUED)
        if self.secrets_refused is not None:
            raise ApplicationError(
                self.secrets_refused, type=wf.SECRETS_UNAVAILABLE, non_retryable=True
            )
        # As the store: nodes already tried last.
        nodes = list(self.behaviours)
        fresh = [n for n in nodes if n not in tried]
        node = (fresh or nodes)[0]
        sealed = f"{self.sealed}{number}@{node}" if self.sealed else ""
        self.placed[number] = Placed(number, node, grant=grant_of(number, node), secrets=sealed)
        return self.placed[number]

    @activity.defn(name="oz0.jobs.place_everywhere")
    async def place_everywhere(self, job_id: str, first_number: int) -> list[Placed]:
        self.everywhere.append(first_number)
        if self.ended:
            return [Placed(first_number, None, ended=True)]
        if self.queued_for > 0:
            self.queued_for -= 1
            return [Placed(first_number, None, WHY_QUEUED)]
        return [
            Placed(first_number + part, node, part=part, grant=grant_of(first_number + part, node))
            for part, node in enumerate(self.behaviours)
        ]

    @activity.defn(name="oz0.jobs.place_on")
    async def place_on(self, job_id: str, number: int, part: int, node_id: str) -> Placed:
        self.places_on.append((number, part, node_id))
        return Placed(number, node_id, part=part, grant=grant_of(number, node_id))

    # The steps are local activities (JobInput.local_steps): the workflow task that ends the
    # job runs the last ones, and an event that comes in meanwhile (the node's answer to a
    # cancel it was sent earlier, say) fails that task's completion, so it is run again, and
    # those steps with it. As the store, these record an attempt's end and the job's once.

    @activity.defn(name="oz0.jobs.end_attempt")
    async def end_attempt(self, end: AttemptEnd) -> str:
        if end.number not in self.recorded:
            self.ends.append(end)
        # As the store: the first end recorded stands.
        return self.recorded.setdefault(end.number, end.because or self.gone)

    @activity.defn(name="oz0.jobs.finish")
    async def finish(self, finish: Finish) -> None:
        self.finish_tries += 1
        if self.finish_tries <= self.finish_fails:
            raise RuntimeError("the database is unavailable")
        if self.finish_waits_for_nodes:
            with contextlib.suppress(AssertionError):
                await asyncio_until(
                    self._nodes_done, FINISH_WAIT, "the nodes done with their attempts", step=0.05
                )
            self.running_at_finish = [a.number for a in self.attempts if not a.answered.is_set()]
        if not self.finished:  # as the store: the first end recorded stands
            self.finished.append(finish)

    def _nodes_done(self) -> bool:
        return all(a.answered.is_set() for a in self.attempts)

    def steps(self) -> list[Callable[..., Any]]:
        # The check for unheard attempts is the servers' own: it asks the real Temporal.
        return [
            self.place, self.place_everywhere, self.place_on, self.end_attempt, self.finish,
            heard.check_heard,
        ]  # fmt: skip

    def node_activity(self, node: str) -> Callable[..., Any]:
        @activity.defn(name=wf.NODE_ACTIVITY)
        async def attempt(payload: dict[str, Any]) -> Result:
            info = activity.info()
            seen = Attempt(node, payload, info.activity_id, info.heartbeat_timeout)
            self.attempts.append(seen)
            script = self.behaviours[node]
            behaviour = script.pop(0) if isinstance(script, list) else script
            if behaviour is not never_heard:
                activity.heartbeat(HEARD)  # as the node's activity does first
            try:
                return await behaviour(seen)
            except asyncio.CancelledError:
                seen.cancelled.set()
                raise
            finally:
                seen.answered.set()

        return attempt


def grant_of(number: int, node: str) -> dict[str, str]:
    """What placement signs for attempt NUMBER on NODE, as a fake (the node checks it)."""
    return {"payload": f"attempt {number} on {node}", "signature": "fake"}


# What a fake node does with an attempt.


def exits(code: int) -> Behaviour:
    async def behaviour(attempt: Attempt) -> Result:
        return _result(code)

    return behaviour


async def hangs(attempt: Attempt) -> Result:
    """Runs until cancelled, heartbeating as the node does."""
    while True:
        activity.heartbeat(HEARD)
        await asyncio.sleep(0.2)


async def stops(attempt: Attempt) -> Result:
    """What an attempt does when its node's runtime stops (block, purge, SIGTERM)."""
    raise ApplicationError(
        "the node's runtime is stopping", type="NodeStopping", non_retryable=True
    )


async def falls_silent(attempt: Attempt) -> Result:
    """The agent was killed: no heartbeat, no answer."""
    await asyncio.sleep(60)
    return _result(0)


async def never_heard(attempt: Attempt) -> Result:
    """A task Temporal counted started that no node ever took (a poll's answer lost on the
    way): not a heartbeat, not an answer."""
    await asyncio.sleep(60)
    return _result(0)


def answers_late(release: asyncio.Event, code: int) -> Behaviour:
    """Hears nothing of a cancellation (no heartbeats) and answers once RELEASE is set."""

    async def behaviour(attempt: Attempt) -> Result:
        await release.wait()
        return _result(code)

    return behaviour


def together(barrier: Callable[[], bool], code: int) -> Behaviour:
    """Exits with CODE once BARRIER holds (every part has started), 99 if it never does."""

    async def behaviour(attempt: Attempt) -> Result:
        deadline = time.monotonic() + SEEN_BOUND
        while not barrier():
            if time.monotonic() > deadline:
                return _result(99)
            activity.heartbeat(HEARD)
            await asyncio.sleep(0.05)
        return _result(code)

    return behaviour


def _result(code: int) -> Result:
    return {
        "exit_code": code,
        "signal": None,
        "ended_because": "exit",
        "output_bytes": 0,
        "truncated": False,
        "output_complete": True,
    }


# --- running a job -------------------------------------------------------------------------


@dataclass
class Job:
    handle: WorkflowHandle[Any, Any]
    fleet: Fleet

    async def result(self) -> str:
        state: str = await asyncio.wait_for(self.handle.result(), JOB_BOUND)
        return state

    async def remove(self, number: int, because: str) -> None:
        """What the sweeper does when the node of attempt NUMBER is blocked or purged."""
        await self.handle.signal("node_removed", args=[number, because])


@contextlib.asynccontextmanager
async def workflow_running(
    creds: Credentials, fleet: Fleet, job: JobInput, *, patched: bool = False
) -> AsyncIterator[Job]:
    """JOB's workflow with FLEET's steps and nodes, each on a worker of its own.

    PATCHED: the test changed the workflow modules' limits (monkeypatch), so the sandbox
    must use that module as it is rather than import a fresh copy of it; every other test
    runs the workflow in the default sandbox, as the servers do."""
    client = await Client.connect(TEMPORAL, namespace=NAMESPACE, tls=creds.tls())
    runner = SandboxedWorkflowRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(wf.__name__)
        if patched
        else SandboxRestrictions.default
    )
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(
                client,
                task_queue=wf.JOBS_QUEUE,
                workflows=[JobWorkflow],
                activities=fleet.steps(),
                workflow_runner=runner,
            )
        )
        for node in fleet.behaviours:
            await stack.enter_async_context(
                Worker(
                    client,
                    task_queue=node,
                    activities=[fleet.node_activity(node)],
                    max_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
                    default_heartbeat_throttle_interval=HEARTBEAT_THROTTLE,
                )
            )
        handle = await client.start_workflow(
            JobWorkflow.run, job, id=job.job_id, task_queue=wf.JOBS_QUEUE
        )
        try:
            yield Job(handle, fleet)
        finally:
            description = await handle.describe()
            if description.raw_description.workflow_execution_info.status == (
                WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
            ):
                await handle.terminate("the test is over")


def job_input(**options: Any) -> JobInput:
    """A job's input as this release's servers start it (its steps local activities)."""
    options.setdefault("command", ["true"])
    options.setdefault("local_steps", True)
    options.setdefault("watch_heard", options["local_steps"])
    return JobInput(job_id="job-" + secrets.token_hex(6), **options)


def run(work: Callable[[], Awaitable[None]]) -> None:
    run_async(work)


# --- one command ------------------------------------------------------------------------


def test_exit_0_succeeds(operator: Credentials) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


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
        return {**_result(3), "applied": applied}

    # The second node is an older agent: it says nothing of what it applied.
    fleet = Fleet({"a": applies, "b": exits(0)})
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

    run(scenario)


def test_a_failing_command_is_retried_elsewhere_first_then_fails_with_its_exit_code(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(3), "b": exits(3)})
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

    run(scenario)


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
    fleet = Fleet({"a": refuses, "b": exits(0)})
    job = job_input(retries=3)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        a = fleet.node("a")
        assert fleet.ran("a") == [1] and fleet.ran("b") == []
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.REFUSED, None)]
        why = f"node {a} refused attempt 1: job {job.job_id} attempt 1: the grant expired 9 s ago"
        assert fleet.finished == [Finish(job.job_id, "failed", None, why)]

    run(scenario)


def test_all_nodes_a_refused_part_is_not_retried_and_the_job_says_which_node_refused(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0), "b": refuses})
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

    run(scenario)


def test_a_command_timing_out_fails_the_job(operator: Credentials) -> None:
    async def times_out(attempt: Attempt) -> Result:
        return {**_result(0), "exit_code": None, "ended_because": "timeout"}

    fleet = Fleet({"a": times_out})
    job = job_input(timeout=5.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "failed"
        assert fleet.ends == [AttemptEnd(job.job_id, 1, EndReason.TIMEOUT, None)]
        assert fleet.finished == [Finish(job.job_id, "failed", None, "timed out after 5 s")]

    run(scenario)


def test_a_removed_node_s_attempt_moves_without_using_up_retries(operator: Credentials) -> None:
    fleet = Fleet({"a": hangs, "b": exits(0)})
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

    run(scenario)


def test_no_move_makes_a_removed_node_s_attempt_end_the_job_lost(operator: Credentials) -> None:
    fleet = Fleet({"a": hangs, "b": exits(0)})
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

    run(scenario)


def test_moves_are_capped(operator: Credentials, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_once, "MAX_MOVES", 2)
    fleet = Fleet({"a": hangs, "b": hangs, "c": hangs})
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

    run(scenario)


def test_a_job_whose_nodes_keep_going_away_ends_lost_after_20_moves(
    operator: Credentials,
) -> None:
    # The workflow as the servers run it (the module's own MAX_MOVES, the default
    # sandbox): every attempt's node stops at once, so each attempt is a move.
    fleet = Fleet({"a": stops, "b": stops})
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

    run(scenario)


def test_a_node_stopping_ends_the_attempt_for_the_store_to_say_why_and_moves_it(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": stops, "b": exits(0)})
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

    run(scenario)


@pytest.mark.parametrize("on_lost", ["move", "wait"])
def test_a_lost_node_s_attempt_is_moved_once_its_lost_after_passes_with_move_or_wait(
    operator: Credentials, on_lost: str
) -> None:
    fleet = Fleet({"a": falls_silent, "b": exits(0)})
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

    run(scenario)


def test_a_first_attempt_placed_before_the_workflow_is_handed_out_without_a_step(
    operator: Credentials,
) -> None:
    """The sweeper placed attempt 1 as it claimed the job (JobInput.first): the workflow's
    first task schedules it, no step before; a retry is placed by the step as ever."""
    fleet = Fleet({"a": [exits(1), exits(0)], "b": exits(0)})
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

    run(scenario)


@pytest.mark.parametrize("all_nodes", [False, True])
def test_an_attempt_no_node_heard_of_is_given_to_its_node_again_not_moved_nor_lost(
    operator: Credentials, all_nodes: bool
) -> None:
    fleet = Fleet({"a": [never_heard, exits(0)], "b": exits(0)})
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

    run(scenario)


@pytest.mark.parametrize("all_nodes", [False, True])
def test_an_attempt_no_node_heard_of_is_given_again_within_seconds_not_after_its_lost_after(
    operator: Credentials, all_nodes: bool
) -> None:
    """Its lost-after (120 s) is past the job's bound: the workflow asks Temporal about the
    attempt HEARD_AFTER after handing it out, fails it by ID as unheard and gives it again."""
    fleet = Fleet({"a": [never_heard, exits(0)], "b": exits(0)})
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

    run(scenario)


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
        return _result(0)

    async def scenario() -> None:
        fleet = Fleet({"a": beats_then_exits})
        async with workflow_running(operator, fleet, job_input()) as j:
            await asyncio.sleep(wf.HEARD_AFTER + 3)
            release.set()
            assert await j.result() == "succeeded"
            long = await j.handle.fetch_history()
        assert fleet.ran("a") == [1]
        assert kinds(long).count("timer_started_event_attributes") == 1
        fleet = Fleet({"a": exits(0)})
        async with workflow_running(operator, fleet, job_input()) as j:
            assert await j.result() == "succeeded"
            short = await j.handle.fetch_history()
        assert kinds(short).count("timer_started_event_attributes") == 1
        assert "marker_recorded_event_attributes" in kinds(short)  # the steps, local
        replayer = Replayer(workflows=[JobWorkflow])
        for history in (long, short):
            assert (await replayer.replay_workflow(history)).replay_failure is None

    run(scenario)


def kinds(history: Any) -> list[str]:
    """Each event's attributes' field name, in order."""
    return [e.WhichOneof("attributes") for e in history.events]


def test_an_attempt_never_heard_of_three_times_is_lost_as_before(operator: Credentials) -> None:
    fleet = Fleet({"a": never_heard, "b": exits(0)})
    fleet.gone = "node lost"
    job = job_input(retries=0, on_lost="fail", lost_after=1.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "lost"
        assert fleet.ran("a") == [1, 1, 1] and fleet.ran("b") == []

    run(scenario)


def test_on_lost_fail_ends_the_job_lost_when_its_node_is_lost_and_runs_it_nowhere_else(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": falls_silent, "b": exits(0)})
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

    run(scenario)


def test_on_lost_fail_does_not_run_again_what_a_stopping_node_killed(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": stops, "b": exits(0)})
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

    run(scenario)


def test_on_lost_fail_still_moves_an_attempt_off_a_blocked_node(operator: Credentials) -> None:
    fleet = Fleet({"a": hangs, "b": exits(0)})
    job = job_input(on_lost="fail", lost_after=60.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            await fleet.started(1)
            await j.remove(1, "node blocked")
            assert await j.result() == "succeeded"
        assert fleet.ran("b") == [2]

    run(scenario)


@pytest.mark.parametrize(
    ("on_lost", "lost_after", "seconds"),
    [("move", None, 15), ("wait", None, 600), ("fail", None, 15), ("wait", 42.0, 42)],
)
def test_each_attempt_is_activity_attempt_n_lost_after_its_job_s_lost_after(
    operator: Credentials, on_lost: str, lost_after: float | None, seconds: int
) -> None:
    fleet = Fleet({"a": [exits(1), exits(0)]})
    job = job_input(retries=1, on_lost=on_lost, lost_after=lost_after)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert [a.activity_id for a in fleet.attempts] == ["attempt-1", "attempt-2"]
        timeout = dt.timedelta(seconds=seconds)
        assert [a.heartbeat_timeout for a in fleet.attempts] == [timeout, timeout]

    run(scenario)


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
        fleet = Fleet({"a": [exits(1), exits(0)]})
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

    run(scenario)


def test_a_late_result_from_a_node_the_job_moved_away_from_is_ignored(
    operator: Credentials,
) -> None:
    release = asyncio.Event()
    fleet = Fleet({"a": answers_late(release, 0), "b": exits(4)})
    job = job_input(retries=0)

    async def b_waits_for_the_late_answer(attempt: Attempt) -> Result:
        await fleet.attempt(1).answered.wait()
        await asyncio.sleep(0.5)  # the late answer reaches the workflow first
        return _result(4)

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

    run(scenario)


# --- queued, cancelled ------------------------------------------------------------------


def test_no_node_within_the_queue_timeout_fails_the_job_with_the_reason(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


def test_a_queued_job_runs_once_a_node_can_take_it(operator: Credentials) -> None:
    fleet = Fleet({"a": exits(0)})
    fleet.queued_for = 1
    job = job_input(queue_timeout=30.0)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        assert [n for n, _, _ in fleet.places] == [1, 1] and fleet.ran("a") == [1]

    run(scenario)


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
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


def test_cancelling_a_running_job_cancels_its_attempt(operator: Credentials) -> None:
    fleet = Fleet({"a": hangs, "b": exits(0)})
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

    run(scenario)


def test_cancelling_a_queued_job(operator: Credentials) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


def test_cancelling_a_job_while_it_is_being_placed(operator: Credentials) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


def test_a_cancellation_while_the_job_s_end_is_being_recorded_does_not_lose_it(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


def test_a_job_cancelled_in_the_database_ends_at_its_next_placement(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0)})
    fleet.ended = True
    job = job_input()

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "cancelled"
        assert fleet.attempts == []
        assert fleet.finished == [Finish(job.job_id, "cancelled", None, "cancelled by an operator")]

    run(scenario)


# --- on every node (--all) ----------------------------------------------------------------


def test_all_nodes_run_concurrently_a_removed_part_ends_lost_a_retried_part_stays(
    operator: Credentials,
) -> None:
    fleet: Fleet

    def all_started() -> bool:
        return {a.node for a in fleet.attempts} == set(fleet.behaviours)

    fleet = Fleet(
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

    run(scenario)


def test_all_nodes_a_failed_part_fails_the_job_with_its_exit_code(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0), "b": exits(7)})
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

    run(scenario)


def test_an_all_nodes_job_cancelled_while_its_end_is_recorded_keeps_its_verdict(
    operator: Credentials,
) -> None:
    """As for one node: the workflow task that ran the last steps is refused for the cancel
    that came meanwhile and run again with the cancel first; every part had ended, so the
    job ends as its parts decided, the same as the end first recorded."""
    fleet = Fleet({"a": exits(0), "b": exits(0)})
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

    run(scenario)


def test_cancelling_an_all_nodes_job_cancels_every_part(operator: Credentials) -> None:
    fleet = Fleet({"a": hangs, "b": hangs})
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

    run(scenario)


# --- secrets ------------------------------------------------------------------------------


def test_each_attempt_carries_only_the_secrets_sealed_for_it_and_its_node(
    operator: Credentials,
) -> None:
    async def unreadable(attempt: Attempt) -> Result:
        raise ApplicationError(
            "its secrets cannot be read on this node", type=wf.SECRETS_UNREADABLE,
            non_retryable=True,
        )  # fmt: skip

    fleet = Fleet({"a": unreadable, "b": exits(0)})
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

    run(scenario)


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

    fleet = Fleet({"a": full, "b": exits(0)})
    job = job_input(unrecorded=knows)

    async def scenario() -> None:
        async with workflow_running(operator, fleet, job) as j:
            assert await j.result() == "succeeded"
        because = EndReason.NODE_COULD_NOT_RECORD if knows else None
        assert fleet.ends[0] == AttemptEnd(job.job_id, 1, because, None, detail=said)
        assert [a.node for a in fleet.attempts] == [fleet.node("a"), fleet.node("b")]

    run(scenario)


def test_a_server_that_cannot_hand_the_secrets_over_fails_the_job_saying_why(
    operator: Credentials,
) -> None:
    fleet = Fleet({"a": exits(0)})
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

    run(scenario)


# --- attempts that outlive their stream: the edge reports for the node -----------------------
#
# The module's real server, its real job worker and database, in the `default` tenant: a
# scripted node (fixtures.edge_client, the real protocol and certificate) holds a control
# stream, and a Temporal worker on its queue takes each attempt and completes it
# asynchronously, as the node hands an attempt to its supervisor; from then on only what
# the node says on its stream (attempt_alive, attempt_done) reaches Temporal, by the edge.

EDGE = f"{SERVER}:7443"
# What a node's attempt returns when its command exited 0 (oz0_node/jobs/attempt.py).
EXIT_0 = {
    "exit_code": 0, "signal": None, "ended_because": "exit", "output_bytes": 0,
    "truncated": False, "output_complete": True,
}  # fmt: skip
# The shortest lost-after the API takes: these tests wait it out.
LOST_AFTER = 5.0


class NodeQueue:
    """A scripted node's Temporal worker (in a thread of its own, on asyncio): each attempt
    taken off the node's queue is noted, then completed asynchronously."""

    def __init__(self, node_id: str, creds: Credentials) -> None:
        self.node_id, self.creds = node_id, creds
        self.taken: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> NodeQueue:
        self._thread.start()
        assert self._ready.wait(SEEN_BOUND), "the node's worker did not start"
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(SEEN_BOUND)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        client = await Client.connect(TEMPORAL, namespace="default", tls=self.creds.tls())

        @activity.defn(name=wf.NODE_ACTIVITY)
        async def attempt(payload: dict[str, Any]) -> Result:
            # As the node's activity: heard at once, then handed over (which takes the
            # node a while: the heartbeat leaves meanwhile), completed by the edge.
            activity.heartbeat(HEARD)
            await asyncio.sleep(0.2)
            self.taken.put((activity.info().activity_id, payload))
            activity.raise_complete_async()

        async with Worker(client, task_queue=self.node_id, activities=[attempt]):
            self._ready.set()
            await self._stop.wait()

    async def next_attempt(self) -> tuple[str, dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: self.taken.get(timeout=SEEN_BOUND))


class StreamNode:
    """A scripted node's control stream: what it sends, and what the edge answers it."""

    def __init__(self, keys: edge_client.NodeKeys, ws: WebSocketConnection) -> None:
        self.keys, self.ws = keys, ws
        self._answers: dict[str, list[dict[str, Any]]] = {
            "attempt_stop": [],
            "attempt_done_ack": [],
        }
        self._arrived = trio.Event()

    @property
    def node_id(self) -> str:
        return self.keys.node_id

    async def run(self) -> None:
        """Read what comes; say something every second (a silent node's stream is ended)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pulse)
            while True:
                message = await edge_client.receive(self.ws)
                if message["type"] in self._answers:
                    self._answers[message["type"]].append(message)
                    self._arrived.set()

    async def _pulse(self) -> None:
        while True:
            await edge_client.send(self.ws, "heartbeat")
            await trio.sleep(1)

    async def alive(self, *attempts: tuple[str, int]) -> None:
        await edge_client.send(
            self.ws, "attempt_alive", attempts=[{"job": j, "attempt": n} for j, n in attempts]
        )

    async def done(self, job: str, number: int, **outcome: Any) -> dict[str, Any]:
        """Send attempt_done; the edge's ack."""
        await edge_client.send(self.ws, "attempt_done", job=job, attempt=number, **outcome)
        return await self.next("attempt_done_ack")

    async def next(self, kind: str, within: float = SEEN_BOUND) -> dict[str, Any]:
        with trio.fail_after(within):
            while not self._answers[kind]:
                self._arrived = trio.Event()
                await self._arrived.wait()
        return self._answers[kind].pop(0)

    def said(self, kind: str) -> list[dict[str, Any]]:
        return list(self._answers[kind])


@contextlib.asynccontextmanager
async def scripted_nodes(
    cli: CliRunner, served: Served, count: int
) -> AsyncIterator[tuple[list[StreamNode], list[NodeQueue], str]]:
    """COUNT nodes joined (accepted at once, labelled with a tag of the test's own), each
    with its stream and its queue's worker; and the tag."""
    tag = secrets.token_hex(3)
    token = await trio.to_thread.run_sync(
        lambda: create_token(cli, served.files.cli_env, "--max-uses", "0")
    )
    ca_pem, _ = await edge_client.fetch_ca(EDGE)
    creds = server_credentials(served.files)
    with contextlib.ExitStack() as workers:
        async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as streams:
            nodes, queues = [], []
            for _ in range(count):
                keys = edge_client.NodeKeys.new()
                keys.ca_pem = ca_pem
                joined = await edge_client.join(EDGE, keys, token=token, labels={"suite": tag})
                assert joined["state"] == "accepted", joined
                ws, first = await streams.enter_async_context(edge_client.control(EDGE, keys))
                assert first["type"] == "welcome", first
                node = StreamNode(keys, ws)
                nursery.start_soon(node.run)
                nodes.append(node)
                queues.append(workers.enter_context(NodeQueue(keys.node_id, creds)))
            yield nodes, queues, tag
            nursery.cancel_scope.cancel()


async def job_run(cli: CliRunner, served: Served, *args: str) -> str:
    ran = await trio.to_thread.run_sync(
        lambda: cli(
            "job", "run", "--detach", "--json", *args, "--", "true", env=served.files.cli_env
        )
    )
    assert ran.code == 0, ran.err
    return str(ran.json()["id"])


async def job_when(
    served: Served, job_id: str, done: Callable[[dict[str, Any]], bool], within: float = JOB_BOUND
) -> dict[str, Any]:
    client = ApiClient(Context.load(served.files.context_path))
    with trio.fail_after(within):
        while True:
            job: dict[str, Any] = await trio.to_thread.run_sync(
                lambda: client.get(f"/api/v1/jobs/{job_id}")
            )
            if done(job):
                return job
            await trio.sleep(0.1)


async def test_attempt_alive_keeps_a_handed_off_attempt_running_and_attempt_done_ends_it(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 2) as ([ours, other], [queue_, _], _tag):
        job_id = await job_run(cli, served, "--node", ours.node_id, "--lost-after", "5s")
        activity_id, payload = await queue_.next_attempt()
        assert activity_id == "attempt-1" and payload["job_id"] == job_id
        # Another node of the tenant reporting on it is told it is not its to run.
        await other.alive((job_id, 1))
        assert await other.next("attempt_stop") == {
            "type": "attempt_stop", "job": job_id, "attempt": 1, "why": "ended",
        }  # fmt: skip
        ack = await other.done(job_id, 1, result={**EXIT_0, "exit_code": 9})
        assert (ack["stored"], ack["reason"]) == (False, "ended")
        # Past its lost-after, heard of through the edge only.
        for _ in range(int(LOST_AFTER) + 2):
            await ours.alive((job_id, 1))
            await trio.sleep(1)
        assert ours.said("attempt_stop") == []
        job = await job_when(served, job_id, lambda j: True)
        assert job["state"] == "running" and len(job["attempts"]) == 1

        ack = await ours.done(job_id, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (True, None)
        job = await job_when(served, job_id, lambda j: j["state"] == "succeeded")
        assert job["exit_code"] == 0 and [a["ended_because"] for a in job["attempts"]] == ["exit"]
        # The same again (its ack lost): nothing is left to complete.
        ack = await ours.done(job_id, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (False, "ended")


def last_heartbeat(served: Served, job_id: str) -> dt.datetime | None:
    """When Temporal last recorded a heartbeat of the job's pending attempt."""

    async def describe() -> dt.datetime | None:
        client = await Client.connect(
            TEMPORAL, namespace="default", tls=server_credentials(served.files).tls()
        )
        described = await client.get_workflow_handle(job_id).describe()
        [pending] = described.raw_description.pending_activities
        if not pending.HasField("last_heartbeat_time"):
            return None
        return pending.last_heartbeat_time.ToDatetime()

    return run_async(describe)


async def test_the_edge_heartbeats_an_attempt_once_a_quarter_of_its_lost_after(
    cli: CliRunner, served: Served
) -> None:
    # Temporal writes each heartbeat to the workflow's shard: a node that says alive four
    # times a second (it says so every second) gets one every 2 s with an 8 s lost-after.
    async with scripted_nodes(cli, served, 1) as ([node], [queue_], _tag):
        job_id = await job_run(cli, served, "--node", node.node_id, "--lost-after", "8s")
        await queue_.next_attempt()
        seen: set[dt.datetime] = set()
        began = time.monotonic()
        while time.monotonic() - began < 6.0:
            await node.alive((job_id, 1))
            await trio.sleep(0.25)
            beat = await trio.to_thread.run_sync(last_heartbeat, served, job_id)
            if beat is not None:
                seen.add(beat)
        ack = await node.done(job_id, 1, result=EXIT_0)
    assert 2 <= len(seen) <= 4, sorted(seen)
    assert ack["stored"] is True


async def test_a_cancelled_job_s_attempt_is_told_to_stop_at_its_next_attempt_alive(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 1) as ([node], [queue_], _tag):
        job_id = await job_run(cli, served, "--node", node.node_id)
        await queue_.next_attempt()
        await node.alive((job_id, 1))
        cancelled = await trio.to_thread.run_sync(
            lambda: cli("job", "cancel", job_id, env=served.files.cli_env)
        )
        assert cancelled.code == 0, cancelled.err
        with trio.fail_after(SEEN_BOUND):
            while not node.said("attempt_stop"):
                await node.alive((job_id, 1))
                await trio.sleep(0.5)
        assert node.said("attempt_stop")[0]["why"] == "cancelled"
        job = await job_when(served, job_id, lambda j: j["state"] == "cancelled")
        assert [a["ended_because"] for a in job["attempts"]] == ["cancelled"]


async def test_a_lost_node_s_job_ends_lost_with_on_lost_fail_and_moves_by_default(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 2) as ([a, b], [queue_a, queue_b], tag):
        failing = await job_run(
            cli, served, "--node", a.node_id, "--on-lost", "fail", "--lost-after", "5s"
        )
        await queue_a.next_attempt()
        moving = await job_run(cli, served, "--selector", f"suite={tag}", "--lost-after", "5s")
        # The least busy node takes it: b (a runs the first job).
        _, payload = await queue_b.next_attempt()
        assert payload["job_id"] == moving

        failed = await job_when(served, failing, lambda j: j["state"] == "lost")
        assert failed["reason"] == (f"node {a.node_id} was lost for more than 5 s (--on-lost fail)")
        assert len(failed["attempts"]) == 1

        _, payload = await queue_a.next_attempt()  # moved: b was lost to it
        assert (payload["job_id"], payload["attempt"]) == (moving, 2)
        job = await job_when(served, moving, lambda j: True)
        assert [(x["node"], x["ended_because"]) for x in job["attempts"]] == [
            (b.node_id, "node lost"), (a.node_id, None),
        ]  # fmt: skip
        # b comes back: its copy is to stop, and its outcome is not taken.
        await b.alive((moving, 1))
        assert (await b.next("attempt_stop"))["why"] == "ended"
        ack = await b.done(moving, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (False, "ended")
        await a.alive((failing, 1))
        assert (await a.next("attempt_stop"))["why"] == "ended"

        # A failure reaches the workflow with the node's type and message.
        refusal = {"type": wf.ATTEMPT_REFUSED, "message": "its grant does not hold"}
        ack = await a.done(moving, 2, failure=refusal)
        assert (ack["stored"], ack["reason"]) == (True, None)
        job = await job_when(served, moving, lambda j: j["state"] == "failed")
        assert job["reason"] == f"node {a.node_id} refused attempt 2: its grant does not hold"
