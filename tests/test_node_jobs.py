"""The node's side of jobs: the real `oz0.job.attempt` hand-over, the agent's attempt
manager and real supervisors running real processes, with a fake edge on the other end of
the link that records what the node sends and answers with scripted acks; the link over a
real control stream to a fake edge; and what outlives what: an attempt outlives its
stream, its runtime and its agent.

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import itertools
import json
import logging
import os
import pwd
import re
import shutil
import signal
import stat
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fixtures.attempt_grants import signed
from fixtures.attempt_processes import all_gone, forked_by_launcher, gone, isolation_for, own_uid
from fixtures.fake_edges import FakeCluster, FakeNet, LongestWait, join_and_stop
from fixtures.node_attempts import (
    ATTEMPT_BOUND,
    CLUSTER_CA,
    JOB,
    NODE_ID,
    FakeEdge,
    grants_for,
    node_manager,
    sign,
    spec,
    unsigned,
    until,
)
from oz0 import pki
from oz0_common.attempt_messages import AttemptResult, EndedBecause
from oz0_node import agent
from oz0_node.errors import EdgeUnavailable
from oz0_node.identity import IdentityDir
from oz0_node.jobs import attempt as attempt_module
from oz0_node.jobs import attempt_files, supervisor_client
from oz0_node.jobs import manager as manager_module
from oz0_node.jobs.attempt import ACTIVITY, attempt_activity, given_again, hand_over
from oz0_node.jobs.attempt_files import OUTPUT_CAP, SupervisedSpec
from oz0_node.jobs.edge_link import OUTPUT_ACK, EdgeLink, LinkDown
from oz0_node.jobs.grants import CLOCK_SKEW, AttemptRefused, GrantCheck, RunRecord
from oz0_node.jobs.isolation import RECORD_FILE, STANDARD_PATH, WORKDIR_PREFIX, Isolation
from oz0_node.jobs.manager import MESSAGE_DATA, NODE_FAULT, AttemptManager
from oz0_node.jobs.process import KILL_GRACE
from oz0_node.jobs.procfs import read_stat
from oz0_node.jobs.tracking import CGROUP_V2, SUBREAPER
from oz0_node.runtime import NodeRuntime, RuntimeSettings

# What workflows from before attempts had IDs of their own schedule
# (oz0/jobs/workflow/_attempts.py).
OLD_HEARTBEAT_TIMEOUT = dt.timedelta(seconds=10)


@dataclass
class TrioPort:
    """The manager as the activity reaches it, from Trio (the agent's own AttemptPort
    crosses from the runtime's asyncio thread: tested through the agent below)."""

    manager: AttemptManager

    async def start(
        self,
        spec: SupervisedSpec,
        lost_after: float,
        beat: Callable[[], None],
        answer: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        while not self.manager.try_reserve():
            beat()
            await trio.sleep(0.2)
        await self.manager.start(spec, lost_after, answer)

    async def notify(self, kind: str, fields: dict[str, Any], within: float) -> None:
        await self.manager.link.send(kind, fields, within)

    async def stop(self, job_id: str, attempt: int, why: str) -> None:
        self.manager.stop(job_id, attempt, why)

    async def runs(self, job_id: str, attempt: int) -> bool:
        return self.manager.runs(job_id, attempt)


async def hand(manager: AttemptManager, raw: dict[str, Any], lost_after: float = 15.0) -> None:
    await hand_over(
        raw,
        node_id=NODE_ID,
        port=TrioPort(manager),
        grants=grants_for(manager.data_dir),
        lost_after=lost_after,
    )


def run_attempt(
    raw: dict[str, Any],
    edge_or_answers: FakeEdge | None,
    data_dir: Path,
    *,
    isolation: Isolation | None = None,
) -> dict[str, object]:
    """RAW handed over as the activity would, run under its supervisor, followed to its
    end by the manager over EDGE: what the node reported (or ApplicationError)."""
    edge = edge_or_answers

    async def main() -> dict[str, object]:
        nonlocal edge
        edge = edge if edge is not None else FakeEdge()
        with trio.fail_after(ATTEMPT_BOUND):
            async with node_manager(data_dir, edge, isolation) as manager:
                await hand(manager, raw)
                await edge.reported.wait()
                await until(lambda: not len(manager))  # its directory removed, once reported
        return edge.outcome()

    return trio.run(main)


def workdirs(attempt: int = 1) -> list[Path]:
    """The working directories of JOB's ATTEMPT left in the system's temporary directory."""
    return list(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{JOB}-{attempt}-*"))


def printed_pids(edge: FakeEdge, into: list[int]) -> list[int]:
    numbers = [int(word) for word in edge.text().split() if word.isdigit()]
    into.extend(numbers)
    return numbers


# --- output, exit code, environment, directory -------------------------------------------


def test_the_output_and_exit_code_reach_the_result_and_the_edge(tmp_path: Path) -> None:
    edge = FakeEdge()
    result = run_attempt(spec("sh", "-c", "echo hello; echo world; exit 3"), edge, tmp_path)
    uid = own_uid(result["applied"])
    assert result == {
        "exit_code": 3,
        "signal": None,
        "ended_because": "exit",
        "output_bytes": 12,
        "truncated": False,
        "output_complete": True,
        "applied": {
            "user": f"uid {uid} (its own)",
            "tracking": "cgroup v2",
            "limits": {},
            "private_tmp": "mount namespace",
            "swept": "nothing left",
        },
    }
    assert edge.chunks() == [("stdout", b"hello\nworld\n")]
    assert all(m["job"] == JOB and m["attempt"] == 1 for m in edge.messages())
    assert [m["seq"] for m in edge.messages()] == list(range(len(edge.messages())))
    assert attempt_module.ACTIVITY == ACTIVITY == "oz0.job.attempt"
    assert not list(attempt_files.attempts_root(tmp_path).iterdir()), "its directory is removed"


def test_a_command_killed_by_a_signal_reports_128_plus_it(tmp_path: Path) -> None:
    result = run_attempt(spec("sh", "-c", "kill -9 $$"), FakeEdge(), tmp_path)
    assert (result["exit_code"], result["signal"]) == (128 + 9, 9)
    assert result["ended_because"] == "exit"


def test_stdout_and_stderr_stay_apart_and_in_order_one_message_at_a_time(
    tmp_path: Path,
) -> None:
    edge = FakeEdge()
    script = "printf a; sleep 0.4; printf b >&2; sleep 0.4; printf c; printf d >&2"
    result = run_attempt(spec("sh", "-c", script), edge, tmp_path)
    assert result["exit_code"] == 0 and result["output_complete"] is True
    assert edge.chunks() == [("stdout", b"a"), ("stderr", b"b"), ("stdout", b"c"), ("stderr", b"d")]
    assert [m["seq"] for m in edge.messages()] == list(range(len(edge.messages())))
    assert edge.most_outstanding == 1, "stop-and-wait: one message unacked at a time"
    # Output is sent while the command runs, not at its end: "a" went out before "b" came.
    assert edge.sent[-1][0] - edge.sent[0][0] > 0.5


def test_the_environment_is_a_clean_one_with_the_jobs_names_and_the_oz0_names_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SETTING", "from-the-agent")
    edge = FakeEdge()
    script = 'echo "$OZ0_JOB_ID $OZ0_ATTEMPT $OZ0_NODE_ID $K ${AGENT_SETTING-unset}"; env'
    run_attempt(
        spec("sh", "-c", script, attempt=2, env={"K": "v w", "OZ0_JOB_ID": "spoofed"}),
        edge,
        tmp_path,
    )
    first, *env_lines = edge.text().splitlines()
    assert first == f"{JOB} 2 {NODE_ID} v w unset", "nothing of the agent's environment"
    env = dict(line.split("=", 1) for line in env_lines if "=" in line)
    assert env["PATH"] == STANDARD_PATH
    # No account: a name that says whose it is.
    assert re.fullmatch(r"oz0-uid-\d+", env["USER"]) and env["LOGNAME"] == env["USER"]
    assert env["HOME"] == env["TMPDIR"] == env["PWD"]


def test_each_attempt_runs_as_its_own_uid_in_a_fresh_directory_of_its_own_removed_after(
    tmp_path: Path,
) -> None:
    edge = FakeEdge()
    # The command makes files, and a directory it leaves unwritable, in its directory.
    script = (
        "id -u; id -G; pwd; stat -c '%u %g %a' .; ls -A; "
        "mkdir locked; touch locked/f; chmod 0 locked; echo > made"
    )
    result = run_attempt(spec("sh", "-c", script, attempt=4), edge, tmp_path)
    assert result["exit_code"] == 0, edge.text("stderr")
    uid, groups, where, owner, *rest = edge.text().splitlines()
    assert int(uid) == own_uid(result["applied"])
    with pytest.raises(KeyError):
        pwd.getpwuid(int(uid))  # no account: crontab, at and su refuse it
    assert groups == uid, "its own group, and no other"
    assert Path(where).parent == Path(tempfile.gettempdir())
    assert Path(where).name.startswith(f"{WORKDIR_PREFIX}{JOB}-4-")
    assert owner == f"{uid} {uid} 700"
    assert rest == [], "it found it empty"
    assert not Path(where).exists()


def test_a_command_that_cannot_be_started_exits_127_or_126_with_one_line(
    tmp_path: Path,
) -> None:
    edge = FakeEdge()
    result = run_attempt(spec("no-such-command-oz0", "x"), edge, tmp_path)
    assert result["exit_code"] == 127 and result["ended_because"] == "exit"
    assert edge.chunks() == [
        ("stderr", b"oz0-node: cannot run 'no-such-command-oz0': No such file or directory\n")
    ]
    # Where the job sees it (not in /tmp, its own).
    plain = Path(tempfile.mkstemp(prefix="oz0-test-plain-", dir="/dev/shm")[1])
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    edge = FakeEdge()
    try:
        result = run_attempt(spec(str(plain), attempt=2), edge, tmp_path)
    finally:
        plain.unlink()
    assert result["exit_code"] == 126
    assert edge.text("stderr") == f"oz0-node: cannot run {str(plain)!r}: Permission denied\n"
    assert not workdirs() and not workdirs(2)


def handed(raw: dict[str, Any], data_dir: Path, edge: FakeEdge | None = None) -> FakeEdge:
    """Hand RAW over (as the activity does) on a node with a stream to EDGE (a fake edge):
    what that edge heard. ApplicationError if the hand-over refuses it."""
    edge = edge if edge is not None else FakeEdge()
    failed: list[ApplicationError] = []

    async def main() -> None:
        async with node_manager(data_dir, edge) as manager:
            try:
                await hand(manager, raw)
            except ApplicationError as e:
                failed.append(e)

    trio.run(main)
    if failed:
        raise failed[0]
    return edge


def test_a_malformed_attempt_is_refused_for_good_and_makes_no_directory(tmp_path: Path) -> None:
    for i, bad in enumerate(
        (
            sign({**unsigned("true"), "job_id": "../../etc"}),
            sign({**unsigned("true"), "attempt": 0}),
            sign({**unsigned("true"), "command": []}),
            sign({**unsigned("true"), "env": {"A=B": "c"}}),
            sign({**unsigned("true"), "timeout": -1}),
            sign({**unsigned("true"), "limits": {"memory": "1G"}}),
            sign({**unsigned("true"), "limits": {"cpu": 0}}),
            sign({**unsigned("true"), "limits": {"max_processes": True}}),
        )
    ):
        # Each on a node of its own: signed, each counts as run (of its grant) once checked.
        data_dir = tmp_path / str(i)
        data_dir.mkdir()
        with pytest.raises(ApplicationError) as raised:
            handed(bad, data_dir)
        assert raised.value.type == "BadAttempt" and raised.value.non_retryable
        assert not workdirs()
        assert not supervisor_client.find_all(data_dir)


# --- the grant: only what the cluster signed, for this node, now, once -------------------


def refused(raw: dict[str, Any], data_dir: Path) -> tuple[ApplicationError, FakeEdge]:
    edge = FakeEdge()
    with pytest.raises(ApplicationError) as raised:
        handed(raw, data_dir, edge)
    assert raised.value.type == "AttemptRefused" and raised.value.non_retryable
    return raised.value, edge


def test_an_attempt_the_cluster_did_not_sign_for_this_node_is_refused_reported_and_not_run(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "ran"
    touch = unsigned("touch", str(marker))
    other_ca = pki.new_ca("test", "cluster")  # same cluster name, another key
    cases = {
        "no grant": (touch, "carries no grant"),
        "another CA": (signed(touch, other_ca, node_id=NODE_ID), "does not verify"),
        "command changed after signing": (
            {**sign(unsigned("true")), "command": ["touch", str(marker)]},
            "command is not the one the grant signed",
        ),
        "env changed after signing": (
            {**sign(touch), "env": {"LD_PRELOAD": "/tmp/x.so"}},
            "environment is not the one",
        ),
        "timeout dropped after signing": (
            {**sign({**touch, "timeout": 5.0}), "timeout": None},
            "timeout is not the one",
        ),
        "another node": (
            signed(touch, CLUSTER_CA, node_id="node-ffffffffffff"),
            "names node_id 'node-ffffffffffff'",
        ),
        "another tenant": (sign(touch, tenant="acme"), "names tenant 'acme'"),
        "another cluster": (sign(touch, cluster="prod"), "names cluster 'prod'"),
        "not a grant": (
            {**touch, "grant": {"payload": "!!", "signature": "AAAA"}},
            "not base64",
        ),
    }
    node = tmp_path / "node"
    node.mkdir()
    for case, (raw, why) in cases.items():
        error, edge = refused(raw, node)
        assert why in str(error), case
        [(kind, fields)] = edge.notified
        assert kind == "attempt_refused", case
        assert (fields["job"], fields["attempt"]) == (JOB, 1), case
        assert why in fields["reason"], case
        assert edge.sent == [] and edge.done == [], case
    assert not marker.exists(), "nothing ran"
    assert not supervisor_client.find_all(node), "no directory was made"


def test_an_attempt_is_run_once_a_replay_of_it_is_refused(tmp_path: Path) -> None:
    # Where the job may write: not the test's own directory (the agent's, private), nor
    # /tmp (its own); a file of root's, since the sweep removes what the job's UID owns.
    shared = Path(tempfile.mkdtemp(prefix="oz0-test-replay-", dir="/dev/shm"))
    shared.chmod(0o777)
    (shared / "count").touch(mode=0o666)
    (shared / "count").chmod(0o666)
    try:
        raw = spec("sh", "-c", f"echo once >> {shared}/count")
        assert run_attempt(raw, FakeEdge(), tmp_path)["exit_code"] == 0
        error, _ = refused(raw, tmp_path)
        assert f"has run job {JOB} attempt 1 already" in str(error)
        assert (shared / "count").read_text() == "once\n"
    finally:
        shutil.rmtree(shared)
    record = tmp_path / "attempts-run"
    assert stat.S_IMODE(record.stat().st_mode) == 0o600
    assert json.loads(record.read_text()).keys() == {f"{JOB}/1"}


def test_a_grant_expires_at_its_not_after_and_the_run_record_forgets_it_then(
    tmp_path: Path,
) -> None:
    now = [1_000_000.0]
    check = GrantCheck(
        cluster="test",
        tenant="default",
        node_id=NODE_ID,
        ca=CLUSTER_CA.cert,
        record=RunRecord.load(tmp_path),
        clock=lambda: now[0],
    )

    def attempt(number: int, not_after: float) -> dict[str, Any]:
        return sign(unsigned("true", attempt=number), not_after=int(not_after))

    # Within the clock skew past not_after: still good; beyond it: expired.
    check.check(attempt(1, now[0] - CLOCK_SKEW + 1))
    with pytest.raises(AttemptRefused, match="expired"):
        check.check(attempt(2, now[0] - CLOCK_SKEW - 1))
    check.check(attempt(3, now[0] + 60))
    record = tmp_path / "attempts-run"
    assert json.loads(record.read_text()).keys() == {f"{JOB}/1", f"{JOB}/3"}
    now[0] += 61 + CLOCK_SKEW  # both grants are past, and their skew
    check.check(attempt(4, now[0] + 60))
    assert json.loads(record.read_text()).keys() == {f"{JOB}/4"}, "expired ones are pruned"
    with pytest.raises(AttemptRefused, match="expired"):
        check.check(attempt(3, now[0] - 61))  # pruned, but its grant cannot come back


@pytest.mark.parametrize(
    ("damage", "said"),
    [
        (lambda p: p.write_text('{"job-00000000abcd/1": 17'), "not JSON"),
        (lambda p: p.write_text("[]"), "not a JSON object"),
        (lambda p: p.write_text('{"job-00000000abcd/1": "soon"}'), "has no not_after"),
        (lambda p: p.write_bytes(b"\xff\xfe"), "not JSON"),
        (lambda p: p.mkdir(), "Is a directory"),
    ],
    ids=["cut short", "a list", "an entry without a number", "not text", "a directory"],
)
def test_an_unreadable_run_record_refuses_every_attempt_until_it_is_repaired(
    damage: Callable[[Path], object], said: str, tmp_path: Path
) -> None:
    path = tmp_path / "attempts-run"
    damage(path)
    check = GrantCheck(
        cluster="test",
        tenant="default",
        node_id=NODE_ID,
        ca=CLUSTER_CA.cert,
        record=RunRecord.load(tmp_path),
    )
    changed: list[str | None] = []
    check.record.on_change = lambda: changed.append(check.record.unusable)
    for number in (1, 2):
        with pytest.raises(AttemptRefused) as refused_by:
            check.check(sign(unsigned("true", attempt=number)))
        reason = refused_by.value.reason
        assert reason.startswith(f"cannot read {path}, this node's record of the attempts it ran")
        assert said in reason and "no attempt runs here until it is repaired" in reason
        assert "fix its JSON or remove it" in reason and "\n" not in reason
    assert path.exists(), "never written over"
    assert changed == []
    if path.is_dir():
        path.rmdir()
    else:
        path.unlink()
    check.check(sign(unsigned("true", attempt=1)))  # read again: repaired, no restart
    assert changed == [None], "said once"
    assert json.loads(path.read_text()).keys() == {f"{JOB}/1"}


# --- ending it: timeout, cancellation, the cluster ----------------------------------------


def test_a_timeout_ends_the_whole_group_sigkill_after_the_grace(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = FakeEdge()
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
    edge = FakeEdge()
    began = time.monotonic()
    result = run_attempt(spec("sh", "-c", "echo $$; exec sleep 60", timeout=0.5), edge, tmp_path)
    assert time.monotonic() - began < 0.5 + KILL_GRACE
    assert (result["ended_because"], result["signal"]) == ("timeout", signal.SIGTERM)
    assert all(gone(pid) for pid in printed_pids(edge, pids))


def test_whatever_the_command_leaves_in_its_group_ends_with_it(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = FakeEdge()
    result = run_attempt(spec("sh", "-c", "sleep 60 > /dev/null & echo $!"), edge, tmp_path)
    assert result["exit_code"] == 0
    assert all(gone(pid) for pid in printed_pids(edge, pids))


def test_the_cluster_tells_it_alive_every_second_and_at_once_on_a_new_stream(
    tmp_path: Path, pids: list[int]
) -> None:
    edge = FakeEdge()

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
    edge = FakeEdge()

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
    edge = FakeEdge(answers=[{"stored": False, "reason": "ended"}])

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
    edge = FakeEdge(answers=[{"stored": False, "reason": "unavailable"}, LinkDown, None])
    result = run_attempt(spec("sh", "-c", "echo hi"), edge, tmp_path)
    assert result["output_complete"] is True
    assert [m["seq"] for m in edge.messages()] == [0, 0, 0, 0]
    assert edge.text() == "hi\n"
    times = [at for at, _ in edge.sent]
    assert all(b - a >= 0.45 for a, b in itertools.pairwise(times)), times


def test_the_cap_keeps_one_mib_then_marks_the_cut_and_drops_the_rest(tmp_path: Path) -> None:
    edge = FakeEdge()
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


# --- what outlives what: the stream, the runtime, the agent ------------------------------


def test_output_made_while_no_stream_is_up_is_kept_and_sent_in_order_when_one_is(
    tmp_path: Path,
) -> None:
    edge = FakeEdge()

    async def main() -> None:
        async with node_manager(tmp_path, edge, attached=False) as manager:
            script = "for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.1; done"
            await hand(manager, spec("sh", "-c", script))
            await trio.sleep(1.5)  # it has ended meanwhile, with no stream to tell
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
    first, second = FakeEdge(), FakeEdge()
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
    edge = FakeEdge()

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
    edge = FakeEdge()

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
    edge = FakeEdge()

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
    edge = FakeEdge()

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
    edge = FakeEdge()

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
    edge = FakeEdge()
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
    edge = FakeEdge()

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


# --- the link over the control stream ----------------------------------------------------


@dataclass
class StuckConn:
    address: str = "edge-a:7443"
    fail: bool = False

    async def send(self, kind: str, **fields: object) -> None:
        if self.fail:
            raise EdgeUnavailable("edge edge-a:7443 closed the connection")
        await trio.sleep_forever()


async def test_a_send_the_stream_does_not_take_in_time_is_link_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = EdgeLink()
    with pytest.raises(LinkDown, match="no control stream"):
        await link.send("job_output", {"seq": 0}, 2.0)
    link.attach(StuckConn())
    began = trio.current_time()
    with pytest.raises(LinkDown, match="did not take a job_output within 2 s"):
        await link.send("job_output", {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0
    link.attach(StuckConn(fail=True))
    with pytest.raises(LinkDown, match="closed the connection"):
        await link.send("job_output", {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0


async def test_an_exchange_gets_the_ack_with_its_key_and_nothing_else(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    link = EdgeLink()
    ids = {"job": JOB, "attempt": 1, "seq": 0}

    @dataclass
    class Answering:
        address: str = "edge-a:7443"

        async def send(self, kind: str, **fields: object) -> None:
            link.deliver(OUTPUT_ACK, {**ids, "seq": 7, "stored": True})  # nobody's
            link.deliver(OUTPUT_ACK, {**ids, "attempt": "1", "stored": True})  # malformed
            link.deliver(OUTPUT_ACK, {**ids, "stored": False, "reason": "ended"})

    link.attach(Answering())
    ack = await link.exchange("job_output", ids, (OUTPUT_ACK, JOB, 1, 0), 5.0)
    assert ack == {**ids, "stored": False, "reason": "ended"}
    assert "malformed job_output_ack" in caplog.text
    link.attach(StuckConn())
    began = trio.current_time()
    assert await link.exchange("job_output", ids, (OUTPUT_ACK, JOB, 1, 0), 0.5) is None
    assert trio.current_time() - began == 0.5
    assert link._waiting == {}


@pytest.fixture
async def net(nursery: trio.Nursery) -> AsyncIterator[FakeNet]:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    cluster.temporal = "edge-a:7233"
    yield FakeNet(cluster, nursery)


@dataclass(eq=False)
class AttemptRuntime:
    """A runtime whose worker takes one real attempt (the real activity, in asyncio on a
    thread of its own, as the worker runs it) and hands it over to the agent's manager.

    Its activity is ACTIVITY_ID, as the workflow scheduled it (anything but `attempt-1`:
    by a workflow from before the upgrade); its heartbeats' times go to BEATS. Once
    CANCEL is set its activity is cancelled, as by its worker's stop if SHUTDOWN."""

    settings: RuntimeSettings
    raw: dict[str, Any]
    outcomes: list[object]
    activity_id: str = "attempt-1"
    beats: list[float] = field(default_factory=list)
    cancel: threading.Event | None = None
    shutdown: bool = False

    async def run(self, running: Callable[[], None]) -> None:
        running()
        if self.outcomes:  # one attempt per test, not one per stream
            await trio.sleep_forever()
        fn = NodeRuntime(self.settings)._activities()[1]
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, activity_id=self.activity_id, heartbeat_timeout=OLD_HEARTBEAT_TIMEOUT
        )
        env.on_heartbeat = lambda *_: self.beats.append(time.monotonic())

        def in_asyncio() -> object:
            async def cancel_when_told(cancel: threading.Event) -> None:
                await asyncio.to_thread(cancel.wait)
                if self.shutdown:
                    env.worker_shutdown()
                env.cancel()

            async def attempt() -> object:
                if self.cancel is None:
                    return await env.run(fn, self.raw)
                told = asyncio.ensure_future(cancel_when_told(self.cancel))
                try:
                    return await env.run(fn, self.raw)
                finally:
                    self.cancel.set()  # the waiting thread ends either way
                    await told

            try:
                return asyncio_run(attempt())
            except ApplicationError as e:
                return e
            except BaseException as e:  # raise_complete_async: handed over; cancelled
                return type(e).__name__

        self.outcomes.append(await trio.to_thread.run_sync(in_asyncio))
        await trio.sleep_forever()

    async def stop(self) -> None:
        pass


def asyncio_run(coroutine: Any) -> object:
    return asyncio.run(coroutine)


async def test_the_agent_hands_attempts_to_its_manager_which_reports_over_the_stream(
    net: FakeNet, tmp_path: Path
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    outcomes: list[object] = []

    def factory(settings: RuntimeSettings) -> AttemptRuntime:
        # Signed as the cluster signs it for this node, in its tenant.
        raw = unsigned("sh", "-c", 'echo "$OZ0_NODE_ID"; echo oops >&2; sleep 1.5')
        grant = signed(raw, net.cluster.ca, node_id=settings.node_id, tenant=settings.namespace)
        return AttemptRuntime(settings, grant, outcomes)

    def reported() -> list[dict[str, Any]]:
        return [
            e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "attempt_done"
        ]

    with trio.fail_after(ATTEMPT_BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: agent.run(
                    agent.StartOptions(data_dir=data),
                    open_stream=net.open_stream,
                    rng=LongestWait(),
                    runtime_factory=factory,
                )
            )
            await until(lambda: bool(reported()))
            nursery.cancel_scope.cancel()
    assert outcomes == ["_CompleteAsyncError"], "the activity completes asynchronously"
    [done] = reported()
    assert done["result"]["exit_code"] == 0 and done["result"]["output_complete"] is True
    sent = [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "job_output"]
    got = {(m["stream"], base64.b64decode(m["data"])) for m in sent}
    assert got == {("stdout", f"{node_id}\n".encode()), ("stderr", b"oops\n")}
    assert sorted(m["seq"] for m in sent) == list(range(len(sent)))
    alive = [
        e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "attempt_alive"
    ]
    assert alive and alive[0]["attempts"] == [{"job": JOB, "attempt": 1}]


def from_node(net: FakeNet, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == kind]


async def held_attempt(
    net: FakeNet, data: Path, script: str, **options: Any
) -> tuple[AttemptRuntime, str]:
    """An agent whose runtime takes one attempt of SCRIPT under a numeric activity ID, as a
    workflow from before the upgrade schedules it (OPTIONS: AttemptRuntime's), until the
    activity has returned; the runtime and the node's ID."""
    node_id = await join_and_stop(net, data)
    runtimes: list[AttemptRuntime] = []

    def factory(settings: RuntimeSettings) -> AttemptRuntime:
        raw = unsigned("sh", "-c", script)
        grant = signed(raw, net.cluster.ca, node_id=settings.node_id, tenant=settings.namespace)
        runtimes.append(AttemptRuntime(settings, grant, [], activity_id="7", **options))
        return runtimes[-1]

    with trio.fail_after(ATTEMPT_BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: agent.run(
                    agent.StartOptions(data_dir=data),
                    open_stream=net.open_stream,
                    rng=LongestWait(),
                    runtime_factory=factory,
                )
            )
            await until(lambda: bool(runtimes) and bool(runtimes[0].outcomes))
            # Whatever the manager would still say about it, said by now.
            await until(lambda: not supervisor_client.find_all(data))
            await trio.sleep(1.5)
            nursery.cancel_scope.cancel()
    return runtimes[0], node_id


async def test_an_attempt_scheduled_before_the_upgrade_is_held_open_and_returns_its_result(
    net: FakeNet, tmp_path: Path
) -> None:
    runtime, node_id = await held_attempt(
        net, tmp_path / "node", 'echo "$OZ0_NODE_ID"; sleep 2.5; echo done'
    )
    [result] = runtime.outcomes
    assert isinstance(result, dict), result
    assert (result["exit_code"], result["ended_because"]) == (0, "exit")
    assert result["output_complete"] is True
    # Its own heartbeats, at least every HEARTBEAT_EVERY while it ran.
    assert len(runtime.beats) >= 3
    gaps = [b - a for a, b in itertools.pairwise(runtime.beats)]
    assert max(gaps) < attempt_module.HEARTBEAT_EVERY + 0.5, gaps
    # Its output goes to the edge as any attempt's; nothing else does.
    sent = from_node(net, "job_output")
    text = b"".join(base64.b64decode(m["data"]) for m in sorted(sent, key=lambda m: m["seq"]))
    assert text == f"{node_id}\ndone\n".encode()
    assert from_node(net, "attempt_alive") == [] and from_node(net, "attempt_done") == []


@pytest.mark.parametrize("shutdown", [False, True])
async def test_a_held_attempt_cancelled_ends_its_command_first(
    net: FakeNet, tmp_path: Path, pids: list[int], shutdown: bool
) -> None:
    cancel = threading.Event()
    data = tmp_path / "node"

    async def cancel_once_running() -> None:
        await until(lambda: bool(from_node(net, "job_output")))
        cancel.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_running)
        runtime, _ = await held_attempt(
            net, data, "echo $$; exec sleep 60", cancel=cancel, shutdown=shutdown
        )
    [sent] = from_node(net, "job_output")
    pid = int(base64.b64decode(sent["data"]))
    pids.append(pid)
    assert gone(pid)
    [outcome] = runtime.outcomes
    if shutdown:
        # As before the upgrade: the runtime's stop ends it, and says so.
        assert isinstance(outcome, ApplicationError), outcome
        assert outcome.type == attempt_module.NODE_STOPPING
    else:
        assert outcome == "CancelledError"
    assert from_node(net, "attempt_alive") == [] and from_node(net, "attempt_done") == []


def test_a_new_agent_ends_a_held_attempt_it_finds_and_reports_nothing_of_it(
    tmp_path: Path, pids: list[int]
) -> None:
    first, second = FakeEdge(), FakeEdge()
    answers: list[dict[str, Any]] = []

    async def main() -> None:
        async with node_manager(tmp_path, first) as manager:
            # Held, as the activity hands over an attempt scheduled before the upgrade.
            await hand_over(
                spec("sh", "-c", "echo $$; exec sleep 60"),
                node_id=NODE_ID,
                port=TrioPort(manager),
                grants=grants_for(manager.data_dir),
                lost_after=10.0,
                answer=answers.append,
            )
            await until(lambda: bool(first.sent))
        (pid,) = printed_pids(first, pids)
        assert not gone(pid)
        async with node_manager(tmp_path, second) as manager:
            assert len(manager) == 1, "the new agent found the attempt"
            await until(lambda: not len(manager))
        assert gone(pid)
        await trio.sleep(1.5)  # an attempt_alive would have gone by now

    trio.run(main)
    assert first.alive == [] and second.alive == []
    assert first.done == [] and second.done == [] and answers == []


def test_logging_names_the_attempt(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="oz0_node.jobs")
    run_attempt(spec("true"), FakeEdge(), tmp_path)
    assert f"job {JOB} attempt 1: handed to its supervisor" in caplog.text


def test_the_runtime_offers_the_job_activity_only_with_an_attempt_manager(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path)
    identity.create()
    identity.save_ca(pki.cert_to_pem(CLUSTER_CA.cert))

    def names(port: Any) -> list[str]:
        settings = RuntimeSettings(
            node_id=NODE_ID,
            namespace="default",
            temporal="127.0.0.1:1",
            identity=identity,
            cluster="test",
            attempts=port,
        )
        defns = map(activity._Definition.must_from_callable, NodeRuntime(settings)._activities())
        return [str(defn.name) for defn in defns]

    assert names(TrioPort(AttemptManager(tmp_path, Isolation.detect(tmp_path)))) == [
        "oz0.node.describe",
        ACTIVITY,
    ]
    assert names(None) == ["oz0.node.describe"]


# --- isolation: the job user, nothing outlives its attempt, limits -------------------------

TRACKINGS = [CGROUP_V2, SUBREAPER]


# Left behind three ways: a new session, a double fork, nohup in a grandchild.
LEAVE_BEHIND = (
    "setsid sleep 600 & echo $!; (sleep 600 & echo $!); "
    "sh -c 'nohup sleep 600 >/dev/null 2>&1 & echo $!'"
)


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_what_an_attempt_left_setsid_or_double_forked_is_gone_when_it_ends(
    tracking: str, tmp_path: Path, pids: list[int]
) -> None:
    edge = FakeEdge()
    result = run_attempt(
        spec("sh", "-c", LEAVE_BEHIND), edge, tmp_path, isolation=isolation_for(tmp_path, tracking)
    )
    assert result["exit_code"] == 0, edge.text("stderr")
    assert result["applied"] == {
        "user": f"uid {own_uid(result['applied'])} (its own)",
        "tracking": tracking,
        "limits": {},
        "private_tmp": "mount namespace",
        "swept": "nothing left",
    }
    left = printed_pids(edge, pids)
    assert len(left) == 3
    all_gone(left, 5.0, f"{tracking}: still running after the attempt ended")
    assert not list(Path("/sys/fs/cgroup/unified").glob(f"oz0-node-{NODE_ID}/{JOB}-*"))


def test_a_job_cannot_read_the_nodes_identity(tmp_path: Path) -> None:
    # Where the job would see it if it could (not in /tmp, its own).
    identity = Path(tempfile.mkdtemp(prefix="oz0-test-identity-", dir="/dev/shm"))
    (identity / "node.key").write_text("THE-NODE-KEY")
    edge = FakeEdge()
    try:
        result = run_attempt(spec("cat", str(identity / "node.key")), edge, tmp_path)
    finally:
        shutil.rmtree(identity)
    assert result["exit_code"] != 0
    assert "THE-NODE-KEY" not in edge.text() + edge.text("stderr")
    assert "Permission denied" in edge.text("stderr")


# Allocates 400 MiB, written (not just reserved), then says so.
ALLOCATE = "a = [b'x' * (1 << 20) for _ in range(400)]; print('allocated')"


def test_a_memory_limit_stops_an_allocation_loop_and_the_result_says_how_limits_applied(
    tmp_path: Path,
) -> None:
    edge = FakeEdge()
    limits = {"memory": 64 << 20, "max_open_files": 64, "address_space": 4 << 30}
    raw = sign({**unsigned("sh", "-c", f'ulimit -n; python3 -c "{ALLOCATE}"'), "limits": limits})
    result = run_attempt(raw, edge, tmp_path)
    # This machine has cgroup v1's memory controller (cgroup v2 has none here): the cgroup's
    # OOM killer ends the loop with SIGKILL.
    applied = result["applied"]
    assert isinstance(applied, dict)
    assert applied["limits"] == {
        "memory": "cgroup v1",
        "max_open_files": "rlimit",
        "address_space": "rlimit",
    }
    assert edge.text().splitlines()[0] == "64"
    assert "allocated" not in edge.text()
    assert result["exit_code"] == 128 + signal.SIGKILL, edge.text("stderr")


def test_a_recorded_pid_now_used_by_another_process_is_never_touched(
    tmp_path: Path, pids: list[int]
) -> None:
    # An attempts.json of the previous release (one agent, its attempts as its children).
    other = subprocess.Popen(["sleep", "600"])
    pids.append(other.pid)
    stat = read_stat(other.pid)
    assert stat is not None
    record = {
        "agent_pid": 1,
        "attempts": {
            f"{JOB}-1": {"workdir": None, "cgroups": [], "pids": [[other.pid, stat.start_time + 1]]}
        },
    }
    (tmp_path / RECORD_FILE).write_text(json.dumps(record))
    assert Isolation.detect(tmp_path).end_leftovers(NODE_ID) == 1
    time.sleep(0.2)
    assert other.poll() is None, "another process with the recorded PID was killed"
    other.kill()
    other.wait()
