"""The node's intake of attempts sent over its control stream (oz0_node/jobs/intake.py):
real grants, the agent's attempt manager and real supervisors running real processes; a
fake edge at the other end of the link records the answers (`attempt_taken`) and the
ends (`attempt_done`). Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from fixtures.attempt_grants import signed
from fixtures.node_attempts import (
    CLUSTER_CA,
    JOB,
    NODE_ID,
    RecordingEdge,
    grants_for,
    node_manager,
    sign,
    spec,
    unsigned,
    until,
)
from oz0_node.jobs.grants import RunRecord
from oz0_node.jobs.intake import Intake
from oz0_node.jobs.manager import AttemptManager


def intake_for(manager: AttemptManager) -> Intake:
    intake = Intake(manager, NODE_ID, None)
    intake.grants = grants_for(manager.data_dir)
    intake.grants.record = manager.run_record(manager.data_dir)
    return intake


def sent(raw: dict[str, Any], lost_after: float = 15.0) -> dict[str, Any]:
    return {"type": "attempt", "attempt": raw, "lost_after": lost_after}


def answers(edge: RecordingEdge, attempt: int = 1) -> list[str]:
    return [
        fields["taken"]
        for kind, fields in edge.notified
        if kind == "attempt_taken" and fields["attempt"] == attempt
    ]


def test_an_attempt_sent_is_answered_started_once_it_runs_and_never_run_twice(
    tmp_path: Path,
) -> None:
    """Sent again while it runs: `runs`; after its end was reported: `ran`. It ran once."""
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            intake = intake_for(manager)
            raw = spec("sh", "-c", "echo $$; sleep 1")
            intake.received(sent(raw))
            await until(lambda: answers(edge) == ["started"])
            assert manager.has(JOB, 1), "answered started only once its supervisor runs"
            intake.received(sent(raw))
            await until(lambda: answers(edge) == ["started", "runs"])
            await until(lambda: len(edge.done) == 1)
            await until(lambda: not len(manager))
            intake.received(sent(raw))
            await until(lambda: len(answers(edge)) == 3)

    trio.run(main)
    assert answers(edge) == ["started", "runs", "ran"]
    assert len(edge.done) == 1 and edge.done[0]["result"]["exit_code"] == 0
    assert len(edge.text().split()) == 1, "one process printed its PID: run once"


def test_the_fifth_waits_for_a_slot_answered_waiting_then_started(tmp_path: Path) -> None:
    edge = RecordingEdge()
    started_at: list[float] = []

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            intake = intake_for(manager)
            for n in range(1, 5):
                intake.received(sent(spec("sleep", "1", attempt=n)))
            await until(lambda: all(answers(edge, n) == ["started"] for n in range(1, 5)))
            began = time.monotonic()
            intake.received(sent(spec("true", attempt=5)))
            await until(lambda: answers(edge, 5) == ["waiting"])
            intake.received(sent(spec("true", attempt=5)))  # sent again meanwhile
            await until(lambda: "started" in answers(edge, 5))
            started_at.append(time.monotonic() - began)
            await until(lambda: len(edge.done) == 5)

    trio.run(main)
    assert answers(edge, 5) == ["waiting", "waiting", "started"]
    assert started_at[0] > 0.5, "it waited for a slot"


def test_an_attempt_the_cluster_did_not_sign_is_refused_told_and_not_run(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    edge = RecordingEdge()
    # Where the attempt could touch it if it ran: root's, in /dev/shm (not the test's own
    # directory, which its UID cannot enter, nor /tmp, its own); a touch shows in its time.
    marks = Path(tempfile.mkdtemp(prefix="oz0-test-intake-", dir="/dev/shm"))
    marks.chmod(0o755)
    request.addfinalizer(lambda: shutil.rmtree(marks))
    mark = marks / "ran"
    mark.touch()
    mark.chmod(0o666)
    os.utime(mark, (0, 0))
    other = signed(unsigned("touch", str(mark)), CLUSTER_CA, node_id="node-ffffffffffff")

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            intake_for(manager).received(sent(other))
            await until(lambda: bool(answers(edge)))

    trio.run(main)
    assert answers(edge) == ["refused"]
    [taken] = [f for k, f in edge.notified if k == "attempt_taken"]
    assert taken["failure"]["type"] == "AttemptRefused"
    assert "node_id" in taken["failure"]["message"]
    assert [k for k, _ in edge.notified].count("attempt_refused") == 1, "told for the audit"
    assert mark.stat().st_mtime == 0, "it ran"


def test_a_malformed_or_expired_attempt_fails_saying_why_and_makes_nothing(
    tmp_path: Path,
) -> None:
    edge = RecordingEdge()
    bad = sign({**unsigned("true", attempt=2), "env": {"A=B": "x"}})
    expired = sign(unsigned("true", attempt=3), not_after=time.time() - 3600)
    not_one: dict[str, Any] = {
        "type": "attempt",
        "attempt": {"job_id": "job-../../etc", "attempt": 1},
    }

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            intake = intake_for(manager)
            intake.received(not_one)  # not even answered: nothing names it
            intake.received(sent(bad))
            intake.received(sent(expired))
            await until(lambda: bool(answers(edge, 2)) and bool(answers(edge, 3)))
            assert not len(manager)

    trio.run(main)
    failures = {
        f["attempt"]: f["failure"]["type"] for k, f in edge.notified if k == "attempt_taken"
    }
    assert failures == {2: "BadAttempt", 3: "GrantExpired"}
    assert answers(edge, 1) == []


def test_an_attempt_its_node_cannot_record_fails_to_move_and_is_not_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The node's disk full (the record of attempts run cannot be written, the fault
    injected): not run, answered `failed` (the part moves to another node), not `refused`
    (which fails the job) nor told as a refusal. bench.soak found it: a node whose data
    directory filled failed every job placed on it meanwhile."""
    edge = RecordingEdge()

    def full(self: RunRecord, key: str, not_after: float, now: float) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(RunRecord, "add", full)

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            intake_for(manager).received(sent(spec("true")))
            await until(lambda: bool(answers(edge)))
            assert not len(manager)

    trio.run(main)
    assert answers(edge) == ["failed"]
    [taken] = [f for k, f in edge.notified if k == "attempt_taken"]
    assert taken["failure"]["type"] == "RecordUnwritable"
    assert "No space left on device" in taken["failure"]["message"]
    assert "attempt_refused" not in [k for k, _ in edge.notified]


def test_an_agent_killed_after_starting_one_finds_it_and_answers_runs_when_sent_again(
    tmp_path: Path,
) -> None:
    """The crash point "node killed after the ack, before the command starts": the answer
    goes only once its supervisor runs, and the supervisor outlives the agent; the next
    agent re-attaches it, answers `runs` to the attempt sent again, and reports its end."""
    first, second = RecordingEdge(), RecordingEdge()
    raw = spec("sh", "-c", "sleep 1; echo done")

    async def main() -> None:
        async with node_manager(tmp_path, first) as manager:
            intake_for(manager).received(sent(raw))
            await until(lambda: answers(first) == ["started"])
        # The agent is gone (its nursery cancelled); the command runs on.
        async with node_manager(tmp_path, second) as manager:
            intake_for(manager).received(sent(raw))
            await until(lambda: bool(answers(second)))
            await until(lambda: len(second.done) == 1)

    trio.run(main)
    assert answers(second) == ["runs"]
    assert second.done[0]["result"]["exit_code"] == 0
    assert "done" in second.text() + first.text()
