"""Attempts of a job whose workflow began before the upgrade, on a real server, a real
agent and real Temporal (127.0.0.247).

A workflow that had scheduled an attempt before `ATTEMPT_BY_ID` (oz0/jobs/workflow/_attempts.py)
replays without the patch's marker, so `workflow.patched` is False for it for good: it
schedules attempts under Temporal's numeric activity IDs with the old heartbeat timeout,
which no edge can complete. This release's agent holds those open itself (the old way,
oz0_node/jobs/attempt.py `run_held`). Here the real job workflow runs in a worker of the
test's (a server's certificate, the tenant's namespace, a task queue of its own so that no
server's worker takes it) with `workflow.patched` answering False for that one patch: the
fault of an old history, injected, nothing else changed. Its steps are the servers' real
ones (placement, grants, the job's rows), its attempts go to the real agent.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio import workflow
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from fixtures.agent import AgentProcess
from fixtures.attempt_processes import all_gone
from fixtures.cluster import ClusterFiles, Served
from fixtures.job_calls import output_of, wait_job
from fixtures.temporal import server_credentials
from oz0 import audit
from oz0.jobs import store
from oz0.jobs import workflow as wf
from oz0.jobs.spec import JobSpec
from oz0.jobs.workflow import JobInput, JobWorkflow, _attempts
from oz0_node.jobs import attempt_files
from tests.conftest import CliRunner, create_token

SERVER = "127.0.0.247"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
TEMPORAL = f"{SERVER}:7233"
# Generous bounds for a loaded 2-core machine; each a deadline, never a measurement.
JOB_BOUND = 60.0
GONE_BOUND = 10.0  # SIGTERM, then SIGKILL after the 3 s grace
# The old heartbeat timeout (_attempts.HEARTBEAT_TIMEOUT, 10 s) shortened for the test's workflows
# (the node heartbeats a held attempt every second), and a command of LINES seconds past it:
# it ends only if heartbeats kept it.
OLD_HEARTBEAT_TIMEOUT = dt.timedelta(seconds=4)
LINES = 6


# --- the workflow as a history from before the upgrade replays it --------------------------


class OldWorkflows:
    """A worker of the real job workflow in the default tenant's namespace, on a queue of
    its own, in a thread with an asyncio loop of its own, as long as the block runs."""

    def __init__(self, files: ClusterFiles) -> None:
        self.files = files
        self.queue = "oz0-jobs-before-upgrade-" + secrets.token_hex(3)
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._client: Client | None = None
        self._failed: BaseException | None = None

    def __enter__(self) -> OldWorkflows:
        self._thread.start()
        if not self._ready.wait(30) or self._client is None:
            raise AssertionError(f"the test's workflow worker did not start: {self._failed!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the test's workflow worker did not stop"

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            client = await Client.connect(
                TEMPORAL, namespace="default", tls=server_credentials(self.files).tls()
            )
            # Only the workflow: its steps go to the servers' job workers (JOBS_QUEUE),
            # its attempts to the node's queue.
            runner = SandboxedWorkflowRunner(
                restrictions=SandboxRestrictions.default.with_passthrough_modules(wf.__name__)
            )
            async with Worker(
                client, task_queue=self.queue, workflows=[JobWorkflow], workflow_runner=runner
            ):
                self._client = client
                self._ready.set()
                await self._stop.wait()
        except BaseException as e:
            self._failed = e
            raise
        finally:
            self._ready.set()

    def _call(self, make: Callable[[], Any], within: float = 30.0) -> Any:
        async def run() -> Any:
            return await make()

        assert self._loop is not None
        done: Future[Any] = asyncio.run_coroutine_threadsafe(run(), self._loop)
        return done.result(within)

    def start(self, job: store.Job) -> None:
        """JOB's workflow, with the input a server of the previous release gave it."""
        given = JobInput(
            job_id=job.id,
            command=job.command,
            env=job.env,
            timeout=job.timeout,
            retries=job.retries,
            all_nodes=job.all_nodes,
            no_move=job.no_move,
            queue_timeout=job.queue_timeout,
            limits=job.limits,
        )

        async def start() -> None:
            assert self._client is not None
            await self._client.start_workflow(
                JobWorkflow.run, given, id=job.id, task_queue=self.queue
            )

        self._call(start)

    def history(self, job_id: str) -> list[HistoryEvent]:
        async def fetch() -> list[HistoryEvent]:
            assert self._client is not None
            history = await self._client.get_workflow_handle(job_id).fetch_history()
            return list(history.events)

        events: list[HistoryEvent] = self._call(fetch)
        return events


@pytest.fixture
def before_the_patch(monkeypatch: pytest.MonkeyPatch) -> None:
    """`workflow.patched(ATTEMPT_BY_ID)` False, as when a history without its marker
    replays (its other patches answer as ever); and the old heartbeat timeout shorter (the
    worker's sandbox passes the module through). Only the test's worker runs workflows in
    this process."""
    real = workflow.patched

    def patched(patch_id: str) -> bool:
        return False if patch_id == wf.ATTEMPT_BY_ID else real(patch_id)

    monkeypatch.setattr(workflow, "patched", patched)
    monkeypatch.setattr(_attempts, "HEARTBEAT_TIMEOUT", OLD_HEARTBEAT_TIMEOUT)


@pytest.fixture
def old_workflows(served: Served, before_the_patch: None) -> Iterator[OldWorkflows]:
    with OldWorkflows(served.files) as workflows:
        yield workflows


# --- the cluster's side -------------------------------------------------------------------


def join_agent(cli: CliRunner, served: Served, data_dir: Path) -> tuple[AgentProcess, str]:
    files = served.files
    token = create_token(cli, files.cli_env)
    agent = AgentProcess.joining(
        data_dir, [f"{SERVER}:7443"], files.ca_hash, token=token, labels={"at": data_dir.name}
    ).start()
    status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    return agent, str(status["node_id"])


def started_job(files: ClusterFiles, node_id: str, command: list[str]) -> store.Job:
    """A job row as `job run` makes it, marked started: no server starts its workflow (the
    test does, on its own queue)."""
    spec = JobSpec(tenant="default", command=command, node=node_id)
    with psycopg.connect(files.main_db) as conn:
        job = store.create(conn, spec, audit.Actor("operator", "admin"))
        store.started(conn, job.id)
    return job


def ended(files: ClusterFiles, job_id: str) -> dict[str, Any]:
    return wait_job(files, job_id, lambda j: j["ended_at"] is not None, JOB_BOUND)


def stdout_of(files: ClusterFiles, job_id: str, attempt: int) -> str:
    return b"".join(
        data for n, stream, data in output_of(files, job_id) if n == attempt and stream == "stdout"
    ).decode()


def printed_pid(files: ClusterFiles, job_id: str, within: float = 30.0) -> int:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        text = stdout_of(files, job_id, 1)
        if text.startswith("pid ") and "\n" in text:
            return int(text.split("\n")[0].split()[1])
        time.sleep(0.1)
    raise AssertionError(f"{job_id} printed no pid")


# --- what Temporal kept -------------------------------------------------------------------


def attempts_scheduled(events: list[HistoryEvent]) -> list[HistoryEvent]:
    return [
        e
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
        and e.activity_task_scheduled_event_attributes.activity_type.name == wf.NODE_ACTIVITY
    ]


def attempt_results(events: list[HistoryEvent]) -> list[dict[str, Any]]:
    """What each attempt's activity completed with, as the workflow got it."""
    ours = {e.event_id for e in attempts_scheduled(events)}
    return [
        json.loads(e.activity_task_completed_event_attributes.result.payloads[0].data)
        for e in events
        if e.HasField("activity_task_completed_event_attributes")
        and e.activity_task_completed_event_attributes.scheduled_event_id in ours
    ]


def markers(events: list[HistoryEvent]) -> list[bytes]:
    return [
        e.marker_recorded_event_attributes.SerializeToString()
        for e in events
        if e.HasField("marker_recorded_event_attributes")
    ]


def check_scheduled_the_old_way(events: list[HistoryEvent]) -> None:
    """Each attempt under Temporal's own (numeric) ID, with the old heartbeat timeout, and
    no ATTEMPT_BY_ID marker: as a workflow from before the patch schedules them."""
    scheduled = attempts_scheduled(events)
    assert scheduled
    for e in scheduled:
        attributes = e.activity_task_scheduled_event_attributes
        assert attributes.activity_id.isdigit(), attributes.activity_id
        assert attributes.heartbeat_timeout.ToTimedelta() == _attempts.HEARTBEAT_TIMEOUT
    found = markers(events)
    assert not [m for m in found if wf.ATTEMPT_BY_ID.encode() in m]
    # The workflow's other patch as ever: the fault is that one patch's marker only.
    assert [m for m in found if wf.QUEUED_BACKOFF.encode() in m]


# --- the tests ----------------------------------------------------------------------------


@pytest.mark.slow
def test_an_attempt_scheduled_before_the_upgrade_is_held_open_and_returns_its_result(
    cli: CliRunner,
    served: Served,
    old_workflows: OldWorkflows,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = served.files
    agent, node = join_agent(cli, served, tmp_path / "node")
    agents.append(agent)

    # 1. It runs past the old heartbeat timeout: the node's heartbeats keep it; its
    # output is stored in order; the workflow gets its result from the node itself.
    lines = "".join(f"line {i}\n" for i in range(1, LINES + 1))
    ok = started_job(
        files, node, ["sh", "-c", f"for i in $(seq {LINES}); do echo line $i; sleep 1; done"]
    )
    old_workflows.start(ok)
    done = ended(files, ok.id)
    assert (done["state"], done["exit_code"]) == ("succeeded", 0), done
    assert [(a["node"], a["ended_because"]) for a in done["attempts"]] == [(node, "exit")]
    assert stdout_of(files, ok.id, 1) == lines, "all of the output, once, in order"
    events = old_workflows.history(ok.id)
    check_scheduled_the_old_way(events)
    [result] = attempt_results(events)
    # What the edge would have completed it with: the supervisor's status and the relay's word.
    assert {k: v for k, v in result.items() if k != "applied"} == {
        "exit_code": 0,
        "signal": None,
        "ended_because": "exit",
        "output_bytes": len(lines),
        "truncated": False,
        "output_complete": True,
    }
    assert set(result["applied"]) >= {"user", "tracking"}, result
    assert f"job {ok.id} attempt 1: handed to its supervisor (held" in agent.log()

    # 2. A failing command: the workflow sees its exit code, the job fails with it.
    failing = started_job(files, node, ["sh", "-c", "echo failing; exit 3"])
    old_workflows.start(failing)
    done = ended(files, failing.id)
    assert (done["state"], done["exit_code"]) == ("failed", 3), done
    assert [a["ended_because"] for a in done["attempts"]] == ["exit"]
    assert stdout_of(files, failing.id, 1) == "failing\n"
    events = old_workflows.history(failing.id)
    check_scheduled_the_old_way(events)
    [result] = attempt_results(events)
    assert (result["exit_code"], result["ended_because"]) == (3, "exit")

    # 3. Cancelled: the activity's cancellation reaches the node through its heartbeat and
    # ends the command.
    long = started_job(files, node, ["sh", "-c", "echo pid $$; exec sleep 600"])
    old_workflows.start(long)
    pid = printed_pid(files, long.id)
    cancelled = cli("job", "cancel", long.id, env=files.cli_env)
    assert cancelled.code == 0, cancelled.err
    all_gone([pid], GONE_BOUND, "the cancelled attempt's command runs on")
    done = ended(files, long.id)
    assert done["state"] == "cancelled", done
    assert [a["ended_because"] for a in done["attempts"]] == ["cancelled"]
    check_scheduled_the_old_way(old_workflows.history(long.id))
    assert f"job {long.id} attempt 1: cancelled; ending it" in agent.log()
    # Nothing of any of them is left on the node.
    root = attempt_files.attempts_root(agent.data_dir)
    deadline = time.monotonic() + GONE_BOUND
    while list(root.iterdir()):
        assert time.monotonic() < deadline, list(root.iterdir())
        time.sleep(0.1)


@pytest.mark.slow
def test_a_held_attempt_is_ended_by_the_next_agent_and_the_job_moves_on(
    cli: CliRunner,
    served: Served,
    old_workflows: OldWorkflows,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = served.files
    agent, node = join_agent(cli, served, tmp_path / "node")
    agents.append(agent)
    job = started_job(
        files,
        node,
        ["sh", "-c", 'echo pid $$; [ "$OZ0_ATTEMPT" = 1 ] && exec sleep 600; echo again'],
    )
    old_workflows.start(job)
    pid = printed_pid(files, job.id)
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(10)
    restarted = AgentProcess.resuming(agent.data_dir).start()
    agents.append(restarted)
    # Nobody can complete its activity any more: the new agent ends it rather than relay it.
    all_gone([pid], GONE_BOUND, "the next agent left the held attempt running")
    attempt_dir = attempt_files.attempts_root(agent.data_dir) / f"{job.id}-1"
    deadline = time.monotonic() + GONE_BOUND
    while attempt_dir.exists():
        assert time.monotonic() < deadline, restarted.log()
        time.sleep(0.1)
    assert f"re-attached job {job.id} attempt 1" in restarted.log()
    # Its heartbeats stopped with the old agent: the workflow gives it up after the old
    # heartbeat timeout and runs it again, on the new agent (the node is the job's only one).
    done = ended(files, job.id)
    assert done["state"] == "succeeded", done
    assert [(a["ended_because"]) for a in done["attempts"]] == ["node lost", "exit"]
    assert stdout_of(files, job.id, 2).endswith("\nagain\n")
    check_scheduled_the_old_way(old_workflows.history(job.id))
