"""How an attempt ends on the node: its timeout, a cancellation, what the cluster's acks
say, and the cap on its output; through the real hand-over, attempt manager and
supervisors, with a fake edge (fixtures/node_attempts.py).

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import base64
import itertools
import json
import signal
import time
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.attempt_processes import gone
from fixtures.node_attempts import (
    JOB,
    RecordingEdge,
    hand,
    node_manager,
    printed_pids,
    run_attempt,
    spec,
    until,
    workdirs,
)
from oz0_node.jobs import manager as manager_module
from oz0_node.jobs.attempt_files import OUTPUT_CAP
from oz0_node.jobs.edge_link import LinkDown
from oz0_node.jobs.manager import MESSAGE_DATA
from oz0_node.jobs.process import KILL_GRACE

# --- ending it: timeout, cancellation, the cluster ----------------------------------------


def test_a_timeout_ends_the_whole_group_sigkill_after_the_grace(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()
    # Both the shell and its child ignore SIGTERM; only SIGKILL ends them.
    script = "trap '' TERM; sleep 60 & echo $! $$; wait; sleep 60"
    began = time.monotonic()
    result = run_attempt(spec("sh", "-c", script, timeout=1.0), edge, tmp_path)
    took = time.monotonic() - began
    assert result["ended_because"] == "timeout"
    assert result["exit_code"] is None and result["signal"] == signal.SIGKILL
    child, shell = printed_pids(edge, pids)
    assert gone(child) and gone(shell)
    assert 1.0 + KILL_GRACE <= took < 1.0 + KILL_GRACE + 5
    assert not workdirs()


def test_a_timeout_ends_a_command_that_obeys_sigterm_without_waiting_the_grace(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()
    began = time.monotonic()
    result = run_attempt(spec("sh", "-c", "echo $$; exec sleep 60", timeout=0.5), edge, tmp_path)
    assert time.monotonic() - began < 0.5 + KILL_GRACE
    assert (result["ended_because"], result["signal"]) == ("timeout", signal.SIGTERM)
    assert all(gone(pid) for pid in printed_pids(edge, pids))


def test_whatever_the_command_leaves_in_its_group_ends_with_it(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()
    result = run_attempt(spec("sh", "-c", "sleep 60 > /dev/null & echo $!"), edge, tmp_path)
    assert result["exit_code"] == 0
    assert all(gone(pid) for pid in printed_pids(edge, pids))


def test_the_cluster_tells_it_alive_every_second_and_at_once_on_a_new_stream(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            await until(lambda: len(edge.alive) >= 4)
            manager.link.detach(edge)
            await trio.sleep(1.5)
            silent = len(edge.alive)
            began = time.monotonic()
            manager.link.attach(edge)
            await until(lambda: len(edge.alive) > silent)
            assert time.monotonic() - began < 0.5, "a new stream is told at once"
            assert silent == 4 or silent == 5  # none while no stream was up
            manager.stop(JOB, 1, "ended")
            await until(lambda: not len(manager))

    trio.run(main)
    times = [at for at, _ in edge.alive[:4]]
    assert all(0.8 < b - a < 1.5 for a, b in itertools.pairwise(times)), times
    assert all(entries == [{"job": JOB, "attempt": 1}] for _, entries in edge.alive)
    assert all(gone(pid) for pid in printed_pids(edge, pids))


def test_cancelled_by_the_cluster_its_processes_end_and_it_reports_cancelled(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            await until(lambda: bool(edge.sent))
            manager.stop(JOB, 1, "cancelled")
            await edge.reported.wait()

    trio.run(main)
    assert edge.done == [{"job": JOB, "attempt": 1, "cancelled": True}]
    (pid,) = printed_pids(edge, pids)
    assert gone(pid)
    assert not workdirs()


def test_an_ack_that_says_ended_kills_the_process_and_nothing_is_reported(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = RecordingEdge(answers=[{"stored": False, "reason": "ended"}])

    async def main() -> None:
        async with node_manager(tmp_path, edge) as manager:
            await hand(manager, spec("sh", "-c", "echo $$; exec sleep 60"))
            await until(lambda: not len(manager))

    trio.run(main)
    assert edge.done == [], "the cluster has moved on from it: no report"
    (pid,) = [int(base64.b64decode(edge.sent[0][1]["data"]))]
    pids.append(pid)
    assert gone(pid)
    assert len(edge.sent) == 1, "nothing more is sent for an attempt that has ended"
    assert not workdirs()


def test_unavailable_and_lost_acks_are_retried_a_second_later_with_the_same_seq(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(manager_module, "ACK_TIMEOUT", 0.5)
    edge = RecordingEdge(answers=[{"stored": False, "reason": "unavailable"}, LinkDown, None])
    result = run_attempt(spec("sh", "-c", "echo hi"), edge, tmp_path)
    assert result["output_complete"] is True
    assert [m["seq"] for m in edge.messages()] == [0, 0, 0, 0]
    assert edge.text() == "hi\n"
    times = [at for at, _ in edge.sent]
    assert all(b - a >= 0.45 for a, b in itertools.pairwise(times)), times


def test_the_cap_keeps_one_mib_then_marks_the_cut_and_drops_the_rest(tmp_path: Path) -> None:
    edge = RecordingEdge()
    # Three times the cap: the command must not block on a full pipe once it is reached.
    result = run_attempt(
        spec("sh", "-c", f"head -c {3 * OUTPUT_CAP} /dev/zero; echo tail >&2"),
        edge,
        tmp_path,
    )
    assert result["exit_code"] == 0
    assert result["truncated"] is True and result["output_bytes"] == OUTPUT_CAP
    assert result["output_complete"] is True
    messages = edge.messages()
    data = [base64.b64decode(m["data"]) for m in messages]
    assert sum(len(d) for d in data) == OUTPUT_CAP == 1 << 20
    assert max(len(d) for d in data) == MESSAGE_DATA == 32 << 10
    marker = messages[-1]
    assert (marker["data"], marker["truncated"], marker["stream"]) == ("", True, "stdout")
    assert not any(m["truncated"] for m in messages[:-1])
    assert edge.text("stderr") == "", "after the cap, nothing more"
    # A full message stays well inside the edge's 64 KiB message limit.
    biggest = max(len(json.dumps({"type": "job_output", **m})) for m in messages)
    assert biggest < 64 << 10
