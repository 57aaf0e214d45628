"""What outlives what on the node: an attempt outlives its stream, its runtime and its
agent (a new agent carries on, an older agent's directory is read), a supervisor killed
is reported, and the slots and deliveries given again start an attempt once; with a fake
edge (fixtures/node_attempts.py).

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import os
import signal
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fixtures.attempt_processes import forked_by_launcher, gone
from fixtures.node_attempts import (
    ATTEMPT_BOUND,
    JOB,
    NODE_ID,
    RecordingEdge,
    TrioPort,
    asyncio_run,
    grants_for,
    hand,
    node_manager,
    printed_pids,
    spec,
    until,
    workdirs,
)
from oz0_common.attempt_messages import AttemptResult, EndedBecause
from oz0_node.jobs import attempt_files, supervisor_client
from oz0_node.jobs import manager as manager_module
from oz0_node.jobs.attempt import attempt_activity, given_again, hand_over
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.manager import NODE_FAULT, AttemptManager
from oz0_node.jobs.process import KILL_GRACE

# --- what outlives what: the stream, the runtime, the agent ------------------------------


def test_output_made_while_no_stream_is_up_is_kept_and_sent_in_order_when_one_is(
    tmp_path: Path,
) -> None:
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge, attached=False) as manager:
            script = "for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.1; done"
            await hand(manager, spec("sh", "-c", script))
            # Ended (its supervisor wrote its status), with no stream to tell.
            status = attempt_files.attempts_root(tmp_path) / f"{JOB}-1" / attempt_files.STATUS_FILE
            await until(status.exists)
            assert edge.sent == [] and edge.done == []
            manager.link.attach(edge)
            await until(lambda: not len(manager))

    trio.run(main)
    assert edge.chunks() == [
        (stream, f"{name} {i}\n".encode())
        for i in (1, 2, 3)
        for stream, name in (("stdout", "out"), ("stderr", "err"))
    ]
    [done] = edge.done
    assert done["result"]["exit_code"] == 0 and done["result"]["output_complete"] is True


def test_a_new_agent_carries_on_where_the_last_left_off_and_the_command_never_noticed(
    tmp_path: Path, pids: list[int]
) -> None:
    first, second = RecordingEdge(), RecordingEdge()
    script = "echo $$; sleep 1.5; echo two; sleep 0.5; echo three"

    async def main() -> None:
        async with node_manager(tmp_path, first) as manager:
            launcher = manager.launcher.pid
            await hand(manager, spec("sh", "-c", script))
            await until(lambda: bool(first.sent))
            [found] = supervisor_client.find_all(tmp_path)
            meta = json.loads((found.dir / attempt_files.PID_FILE).read_text())
            # Forked by the agent's launcher, which goes with its agent.
            assert launcher is not None and forked_by_launcher(int(meta["pid"]))
        assert gone(launcher)
        # The first agent is gone (its tasks cancelled, as by kill -9); the command runs on.
        (pid,) = printed_pids(first, pids)
        assert not gone(pid)
        async with node_manager(tmp_path, second) as manager:
            assert len(manager) == 1, "the new agent found the attempt"
            await until(lambda: not len(manager))
        assert gone(pid)

    trio.run(main)
    assert second.messages()[0]["seq"] == len(first.messages())
    pid_line = base64.b64decode(first.messages()[0]["data"]).decode()
    rest = b"".join(base64.b64decode(m["data"]) for m in second.messages()).decode()
    assert pid_line + rest == f"{pid_line}two\nthree\n", "all of it, once, in order"
    [done] = second.done
    assert done["result"]["exit_code"] == 0


# An ended attempt's directory as the release before attempt_files.py left it (04c3a31:
# supervisor.py's main and _status, isolation.AttemptRecord, manager.py's attempt.json and
# relay.json), byte for byte; its agent had relayed the first record. The status of the
# releases before e725849 had no output_complete.
OLD_OUTPUT = struct.pack(">BI", 1, 4) + b"one\n" + struct.pack(">BI", 2, 4) + b"two\n"
OLD_APPLIED = '{"user": "oz0-job", "tracking": "cgroup v2", "limits": {}}'
OLD_STATUS = (
    '{"exit_code": 3, "signal": null, "ended_because": "exit", "output_bytes": 8, '
    f'"truncated": false, "applied": {OLD_APPLIED}, "output_complete": true}}\n'
)
OLDER_STATUS = (
    '{"exit_code": 3, "signal": null, "ended_because": "exit", "output_bytes": 8, '
    f'"truncated": false, "applied": {OLD_APPLIED}}}\n'
)


@pytest.mark.parametrize("status", [OLD_STATUS, OLDER_STATUS], ids=["04c3a31", "before e725849"])
def test_an_attempt_directory_an_older_agent_left_is_read_relayed_and_reported(
    status: str, tmp_path: Path
) -> None:
    directory = attempt_files.attempts_root(tmp_path) / f"{JOB}-1"
    directory.mkdir(mode=0o700, parents=True)
    files = {
        "lock": b"",
        "supervisor.json": b'{"pid": 4194000, "start_time": 12345}',
        "supervisor.log": b"2026-12-06 06:49:56,000 INFO job job-00000000abcd attempt 1: ...\n",
        "output": OLD_OUTPUT,
        "tracking.json": b'{\n "agent_pid": 4194000,\n "attempts": {}\n}\n',
        "status.json": status.encode(),
        "attempt.json": b'{"lost_after": 15.0}',
        "relay.json": b'{"seq": 1, "offset": 9, "inflight": null}',
    }
    for name, data in files.items():
        (directory / name).write_bytes(data)
    [found] = supervisor_client.find_all(tmp_path)
    read = found.status()
    assert read is not None and read.version == 1
    assert read.result == AttemptResult(
        3, None, EndedBecause.EXIT, 8, False, json.loads(OLD_APPLIED), output_complete=True
    )
    assert not found.alive()
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await until(lambda: not len(manager))

    trio.run(main)
    assert [(m["seq"], m["stream"]) for m in edge.messages()] == [(1, "stderr")]
    assert edge.text("stderr") == "two\n"
    [done] = edge.done
    assert done["result"] == json.loads(OLD_STATUS)
    assert not directory.exists(), "removed once reported"


def test_a_supervisor_killed_is_reported_and_what_it_left_is_ended(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            await until(lambda: bool(edge.sent))
            [found] = supervisor_client.find_all(tmp_path)
            meta = json.loads((found.dir / attempt_files.PID_FILE).read_text())
            os.kill(int(meta["pid"]), signal.SIGKILL)
            await edge.reported.wait()

    trio.run(main)
    [done] = edge.done
    assert done["failure"]["type"] == "SupervisorLost"
    (pid,) = printed_pids(edge, pids)
    assert gone(pid)
    assert not workdirs()


def test_an_attempt_the_node_cannot_follow_is_ended_and_reported_and_the_rest_carry_on(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            await until(lambda: edge.text().strip().isdigit())  # its PID, stored
            printed_pids(edge, pids)  # (the fake edge keys output by seq alone)
            await hand(manager, spec("sh", "-c", "sleep 1; echo second", attempt=2))
            # A record of no stream this node knows at the end of the first's output file.
            [damaged] = [s for s in supervisor_client.find_all(tmp_path) if s.attempt == 1]
            with (damaged.dir / attempt_files.OUTPUT_FILE).open("ab") as f:
                f.write(attempt_files.HEADER.pack(9, 1) + b"x")
            await until(lambda: len(edge.done) == 2)
            await until(lambda: not len(manager))

    trio.run(main)
    faulted, second = sorted(edge.done, key=lambda d: d["attempt"])
    assert faulted["failure"]["type"] == NODE_FAULT
    assert "no such stream code 9" in faulted["failure"]["message"]
    assert second["result"]["exit_code"] == 0
    (pid,) = pids
    assert gone(pid)
    assert not workdirs(1) and not supervisor_client.find_all(tmp_path)


def test_an_attempt_launched_while_the_node_ends_all_of_them_is_ended_too(
    tmp_path: Path, pids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A launch slowed down (as on a loaded machine) so that the block comes during it.
    launching, launched = threading.Event(), threading.Event()
    real_launch = supervisor_client.launch

    def slow_launch(*args: Any) -> supervisor_client.Supervised:
        launching.set()
        handle = real_launch(*args)
        launched.wait(10)
        return handle

    monkeypatch.setattr(supervisor_client, "launch", slow_launch)
    edge = RecordingEdge()

    async def main() -> None:
        handed = trio.Event()

        async def hand_it(manager: AttemptManager) -> None:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            handed.set()

        async with node_manager(tmp_path, edge) as manager, trio.open_nursery() as nursery:
            nursery.start_soon(hand_it, manager)
            await until(launching.is_set)
            await manager.stop_all("blocked")
            launched.set()
            await handed.wait()
            # Ended (a command left running would hold it for 60 s), and not reported.
            await until(lambda: not len(manager), KILL_GRACE + 10)

    trio.run(main)
    assert all(gone(pid) for pid in printed_pids(edge, pids))
    assert edge.done == [] and not supervisor_client.find_all(tmp_path)


def test_a_node_no_server_heard_from_for_its_lost_after_ends_the_attempt_unreported(
    tmp_path: Path, pids: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "REPORT_GRACE", 0.5)
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"), lost_after=1.0)
            await until(lambda: bool(edge.sent))
            manager.link.detach(edge)
            began = time.monotonic()
            await until(lambda: not len(manager))
            assert 1.5 <= time.monotonic() - began < 1.5 + KILL_GRACE + 2

    trio.run(main)
    (pid,) = printed_pids(edge, pids)
    assert gone(pid)
    assert edge.done == []


def test_at_most_four_run_at_once_and_the_fifth_waits_for_a_slot(tmp_path: Path) -> None:
    edge = RecordingEdge()
    beats: list[float] = []

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            for n in range(1, 5):
                await hand(manager, spec("sleep", "1", attempt=n))
            assert len(manager) == 4
            began = time.monotonic()
            await hand_over(
                spec("true", attempt=5),
                node_id=NODE_ID,
                port=TrioPort(manager),
                grants=grants_for(tmp_path),
                beat=lambda: beats.append(time.monotonic()),
            )
            assert time.monotonic() - began > 0.5, "it waited for a slot"
            await until(lambda: len(edge.done) == 5)

    trio.run(main)
    assert beats, "the activity heartbeats while it waits"


def test_an_attempt_given_again_while_it_runs_here_is_not_started_twice(tmp_path: Path) -> None:
    """The cluster gives an attempt again when no heartbeat of it reached Temporal in time;
    one this node runs is recognised (its end goes to the edge as before), nothing else is."""
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            port = TrioPort(manager)
            raw = spec("sleep", "1")
            assert not await given_again(raw, port)
            await hand(manager, raw)
            assert await given_again(raw, port)
            assert not await given_again(spec("sleep", "1", attempt=2), port)
            assert not await given_again({"job_id": "job-../../etc", "attempt": 1}, port)
            await until(lambda: len(edge.done) == 1)
            await until(lambda: not manager.runs(JOB, 1))
            # Ended and reported: a task given again now is refused by the run record.
            assert not await given_again(raw, port)

    trio.run(main)
    assert len(edge.done) == 1, "run once"


@dataclass
class SlowPort:
    """The manager as the activity reaches it, its slot long to come (in asyncio, as the
    agent's runtime runs the activity): what was started, nothing run."""

    started: list[tuple[str, int]] = field(default_factory=list)
    slot: asyncio.Event = field(default_factory=asyncio.Event)

    async def start(
        self,
        spec: SupervisedSpec,
        lost_after: float,
        beat: Callable[[], None],
        answer: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        while not self.slot.is_set():
            beat()
            await asyncio.sleep(0.05)
        self.started.append((spec.job_id, spec.attempt))

    async def notify(self, kind: str, fields: dict[str, Any], within: float) -> None:
        pass

    async def stop(self, job_id: str, attempt: int, why: str) -> None:
        pass

    async def runs(self, job_id: str, attempt: int) -> bool:
        return False  # started only once the slot comes: the manager knows of none yet


def test_an_attempt_given_again_while_its_first_delivery_waits_for_a_slot_starts_once(
    tmp_path: Path,
) -> None:
    """The cluster gives an attempt again when its first heartbeat came late (it asks
    Temporal a few seconds after handing it out, oz0/jobs/heard.py): the node may still be
    handing the first delivery over, its manager not yet running it. The second delivery
    starts nothing (the edge completes its activity, of the same ID, at the attempt's end)."""
    port = SlowPort()
    fn = attempt_activity(NODE_ID, tmp_path, port, grants_for(tmp_path))
    raw = spec("true")

    async def delivery() -> str:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, activity_id="attempt-1")
        try:
            await env.run(fn, raw)
        except BaseException as e:  # raise_complete_async: handed over, the edge completes it
            return type(e).__name__
        return "returned"

    async def main() -> list[str]:
        first = asyncio.ensure_future(delivery())
        await asyncio.sleep(0.3)  # the first waits for its slot
        second = await asyncio.wait_for(delivery(), ATTEMPT_BOUND)
        assert port.started == [], "the second delivery started nothing"
        port.slot.set()
        return [await asyncio.wait_for(first, ATTEMPT_BOUND), second]

    assert asyncio_run(main()) == ["_CompleteAsyncError", "_CompleteAsyncError"]
    assert port.started == [(JOB, 1)]


def test_a_bad_attempt_is_refused_saying_why_whatever_its_fields_hold(tmp_path: Path) -> None:
    """Fields of any JSON type (a list where the job's ID goes): one clear refusal, no
    TypeError from the activity's own bookkeeping."""
    port = SlowPort()
    fn = attempt_activity(NODE_ID, tmp_path, port, grants_for(tmp_path))
    raw = {**spec("true"), "job_id": ["job-0123456789ab"]}

    async def delivery() -> object:
        env = ActivityEnvironment()
        env.info = dataclasses.replace(env.info, activity_id="attempt-1")
        return await env.run(fn, raw)

    with pytest.raises(ApplicationError):
        asyncio_run(delivery())
    assert port.started == []
