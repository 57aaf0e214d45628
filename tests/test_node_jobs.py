"""The node's side of jobs: the real `oz0.job.attempt` activity (temporalio's
ActivityEnvironment) running real processes, with a fake output link that records what
would reach the edge and answers with scripted acks; the link over a real control stream
to a fake edge; and the runtime's stop, which ends attempts before its worker.

Processes run on real time, with generous bounds; the Trio side of the link on MockClock.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fixtures.attempt_grants import check_for, signed
from fixtures.fake_edges import FakeCluster, FakeNet, LongestWait, join_and_stop
from oz0 import pki
from oz0_node import agent
from oz0_node.errors import EdgeUnavailable
from oz0_node.identity import IdentityDir
from oz0_node.jobs import attempt as attempt_module
from oz0_node.jobs import output
from oz0_node.jobs.attempt import ACTIVITY, NODE_STOPPING, RunningAttempts, attempt_activity
from oz0_node.jobs.grants import CLOCK_SKEW, AttemptRefused, GrantCheck, RunRecord
from oz0_node.jobs.isolation import RECORD_FILE, STANDARD_PATH, WORKDIR_PREFIX, Isolation
from oz0_node.jobs.job_user import DEFAULT_JOB_USER
from oz0_node.jobs.link import Ack, LinkDown, StreamLink, send_bounded
from oz0_node.jobs.process import KILL_GRACE, members
from oz0_node.jobs.procfs import read_stat
from oz0_node.jobs.tracking import CGROUP_V2, SCAN_EVERY, SUBREAPER
from oz0_node.runtime import STOP_TIMEOUT, NodeRuntime, RuntimeSettings, grant_check

NODE_ID = "node-0123456789ab"
JOB = "job-00000000abcd"
CLUSTER_CA = pki.new_ca("test", "cluster")
# Generous: the slowest case is a kill after the grace.
ATTEMPT_BOUND = 20.0

Answer = Ack | None | type[LinkDown]


def unsigned(
    *command: str,
    attempt: int = 1,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    return {
        "job_id": JOB,
        "attempt": attempt,
        "command": list(command),
        "env": env or {},
        "timeout": timeout,
    }


def sign(raw: dict[str, Any], **changes: Any) -> dict[str, Any]:
    """RAW as the cluster (CLUSTER_CA) signs it for this node; CHANGES: signed otherwise."""
    return signed(raw, CLUSTER_CA, node_id=NODE_ID, **changes)


def spec(
    *command: str,
    attempt: int = 1,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """An attempt the cluster signed for this node."""
    return sign(unsigned(*command, attempt=attempt, env=env, timeout=timeout))


def grants_for(data_dir: Path) -> GrantCheck:
    return check_for(CLUSTER_CA, NODE_ID, data_dir)


def activity_for(
    data_dir: Path, link: FakeLink, attempts: RunningAttempts | None = None
) -> Callable[[dict[str, Any]], Any]:
    """The real `oz0.job.attempt` of a node of CLUSTER_CA's cluster, its data in DATA_DIR."""
    grants = grants_for(data_dir)
    running = attempts if attempts is not None else RunningAttempts()
    return attempt_activity(NODE_ID, data_dir, link, running, grants)


@dataclass
class FakeLink:
    """What would go to the edge, each ack from ANSWERS in turn (then stored), thread-safe
    enough for one attempt: the attempt is its only caller."""

    answers: list[Answer] = field(default_factory=list)
    sent: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    outstanding: int = 0
    most_outstanding: int = 0
    first_sent: threading.Event = field(default_factory=threading.Event)
    notified: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    async def notify(self, kind: str, fields: dict[str, Any], within: float) -> None:
        self.notified.append((kind, dict(fields)))

    async def exchange(self, fields: dict[str, Any], within: float) -> Ack | None:
        self.outstanding += 1
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        try:
            self.sent.append((time.monotonic(), dict(fields)))
            self.first_sent.set()
            answer = self.answers.pop(0) if self.answers else Ack(stored=True)
            if answer is LinkDown:
                raise LinkDown("test: no stream")
            if answer is None:
                await asyncio.sleep(within)
                return None
            assert isinstance(answer, Ack)
            return answer
        finally:
            self.outstanding -= 1

    def messages(self) -> list[dict[str, Any]]:
        return [fields for _, fields in self.sent]

    def stored(self) -> list[dict[str, Any]]:
        """Each seq once (the last send of a seq is the one acked)."""
        by_seq = {m["seq"]: m for m in self.messages()}
        return [by_seq[seq] for seq in sorted(by_seq)]

    def chunks(self) -> list[tuple[str, bytes]]:
        """The output as it would be stored: consecutive data of one stream together."""
        merged: list[tuple[str, bytes]] = []
        for m in self.stored():
            data = base64.b64decode(m["data"])
            if not data:
                continue
            if merged and merged[-1][0] == m["stream"]:
                merged[-1] = (m["stream"], merged[-1][1] + data)
            else:
                merged.append((m["stream"], data))
        return merged

    def text(self, stream: str = "stdout") -> str:
        return b"".join(d for s, d in self.chunks() if s == stream).decode()


def gone(pid: int) -> bool:
    """No such process, or only its zombie (this machine's PID 1 may not reap orphans)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


@pytest.fixture
def pids() -> Iterator[list[int]]:
    """PIDs a test's commands printed: whatever a failing test left is killed."""
    found: list[int] = []
    yield found
    for pid in found:
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)


def printed_pids(link: FakeLink, into: list[int]) -> list[int]:
    numbers = [int(word) for word in link.text().split() if word.isdigit()]
    into.extend(numbers)
    return numbers


def run_attempt(
    raw: dict[str, Any],
    link: FakeLink,
    data_dir: Path,
    *,
    env: ActivityEnvironment | None = None,
    attempts: RunningAttempts | None = None,
) -> dict[str, object]:
    fn = activity_for(data_dir, link, attempts)

    async def main() -> dict[str, object]:
        return await asyncio.wait_for((env or ActivityEnvironment()).run(fn, raw), ATTEMPT_BOUND)

    return asyncio.run(main())


def workdirs(attempt: int = 1) -> list[Path]:
    """The working directories of JOB's ATTEMPT left in the system's temporary directory."""
    return list(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{JOB}-{attempt}-*"))


# --- output, exit code, environment, directory -------------------------------------------


def test_the_output_and_exit_code_reach_the_result_and_the_edge(tmp_path: Path) -> None:
    link = FakeLink()
    result = run_attempt(spec("sh", "-c", "echo hello; echo world; exit 3"), link, tmp_path)
    assert result == {
        "exit_code": 3,
        "signal": None,
        "ended_because": "exit",
        "output_bytes": 12,
        "truncated": False,
        "output_complete": True,
        "applied": {"user": DEFAULT_JOB_USER, "tracking": "cgroup v2", "limits": {}},
    }
    assert link.chunks() == [("stdout", b"hello\nworld\n")]
    assert all(m["job"] == JOB and m["attempt"] == 1 for m in link.messages())
    assert [m["seq"] for m in link.messages()] == list(range(len(link.messages())))
    assert attempt_module.ACTIVITY == ACTIVITY == "oz0.job.attempt"


def test_a_command_killed_by_a_signal_reports_128_plus_it(tmp_path: Path) -> None:
    result = run_attempt(spec("sh", "-c", "kill -9 $$"), FakeLink(), tmp_path)
    assert (result["exit_code"], result["signal"]) == (128 + 9, 9)
    assert result["ended_because"] == "exit"


def test_stdout_and_stderr_stay_apart_and_in_order_one_message_at_a_time(
    tmp_path: Path,
) -> None:
    link = FakeLink()
    script = "printf a; sleep 0.4; printf b >&2; sleep 0.4; printf c; printf d >&2"
    result = run_attempt(spec("sh", "-c", script), link, tmp_path)
    assert result["exit_code"] == 0 and result["output_complete"] is True
    assert link.chunks() == [("stdout", b"a"), ("stderr", b"b"), ("stdout", b"c"), ("stderr", b"d")]
    assert [m["seq"] for m in link.messages()] == list(range(len(link.messages())))
    assert link.most_outstanding == 1, "stop-and-wait: one message unacked at a time"
    # Output is sent while the command runs, not at its end: "a" went out before "b" came.
    first_at = link.sent[0][0]
    last_at = link.sent[-1][0]
    assert last_at - first_at > 0.5


def test_the_environment_is_a_clean_one_with_the_jobs_names_and_the_oz0_names_win(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGENT_SETTING", "from-the-agent")
    link = FakeLink()
    script = 'echo "$OZ0_JOB_ID $OZ0_ATTEMPT $OZ0_NODE_ID $K ${AGENT_SETTING-unset}"; env'
    run_attempt(
        spec("sh", "-c", script, attempt=2, env={"K": "v w", "OZ0_JOB_ID": "spoofed"}),
        link,
        tmp_path,
    )
    first, *env_lines = link.text().splitlines()
    assert first == f"{JOB} 2 {NODE_ID} v w unset", "nothing of the agent's environment"
    env = dict(line.split("=", 1) for line in env_lines if "=" in line)
    assert env["PATH"] == STANDARD_PATH
    assert env["USER"] == env["LOGNAME"] == DEFAULT_JOB_USER
    assert env["HOME"] == env["TMPDIR"] == env["PWD"]


def test_each_attempt_runs_as_the_job_user_in_a_fresh_directory_of_its_own_removed_after(
    tmp_path: Path,
) -> None:
    link = FakeLink()
    # The command makes files, and a directory it leaves unwritable, in its directory.
    script = (
        "id -u; pwd; stat -c '%U %a' .; ls -A; "
        "mkdir locked; touch locked/f; chmod 0 locked; echo > made"
    )
    result = run_attempt(spec("sh", "-c", script, attempt=4), link, tmp_path)
    assert result["exit_code"] == 0, link.text("stderr")
    uid, where, owner, *rest = link.text().splitlines()
    assert int(uid) == pwd.getpwnam(DEFAULT_JOB_USER).pw_uid
    assert Path(where).parent == Path(tempfile.gettempdir())
    assert Path(where).name.startswith(f"{WORKDIR_PREFIX}{JOB}-4-")
    assert owner == f"{DEFAULT_JOB_USER} 700"
    assert rest == [], "it found it empty"
    assert not Path(where).exists()
    assert not (tmp_path / "runtimes").exists()


def test_a_command_that_cannot_be_started_exits_127_or_126_with_one_line(
    tmp_path: Path,
) -> None:
    link = FakeLink()
    result = run_attempt(spec("no-such-command-oz0", "x"), link, tmp_path)
    assert result["exit_code"] == 127 and result["ended_because"] == "exit"
    assert link.chunks() == [
        ("stderr", b"oz0-node: cannot run 'no-such-command-oz0': No such file or directory\n")
    ]
    plain = tmp_path / "plain-file"
    plain.write_text("echo hi\n")
    link = FakeLink()
    result = run_attempt(spec(str(plain), attempt=2), link, tmp_path)
    assert result["exit_code"] == 126
    assert link.text("stderr") == f"oz0-node: cannot run {str(plain)!r}: Permission denied\n"
    assert not workdirs() and not workdirs(2)


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
            run_attempt(bad, FakeLink(), data_dir)
        assert raised.value.type == "BadAttempt" and raised.value.non_retryable
        assert not workdirs()


# --- the grant: only what the cluster signed, for this node, now, once -------------------


def refused(raw: dict[str, Any], data_dir: Path) -> tuple[ApplicationError, FakeLink]:
    link = FakeLink()
    with pytest.raises(ApplicationError) as raised:
        run_attempt(raw, link, data_dir)
    assert raised.value.type == "AttemptRefused" and raised.value.non_retryable
    return raised.value, link


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
    for case, (raw, why) in cases.items():
        error, link = refused(raw, tmp_path / "node")
        assert why in str(error), case
        [(kind, fields)] = link.notified
        assert kind == "attempt_refused", case
        assert (fields["job"], fields["attempt"]) == (JOB, 1), case
        assert why in fields["reason"], case
        assert link.sent == [], case
    assert not marker.exists(), "nothing ran"
    assert not (tmp_path / "node" / "runtimes").exists(), "no directory was made"


def test_an_attempt_is_run_once_a_replay_of_it_is_refused(tmp_path: Path) -> None:
    # Where the job user may write (the test's own directory is the agent's, private).
    shared = Path(tempfile.mkdtemp(prefix="oz0-test-replay-"))
    shared.chmod(0o777)
    try:
        raw = spec("sh", "-c", f"echo once >> {shared}/count")
        assert run_attempt(raw, FakeLink(), tmp_path)["exit_code"] == 0
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


# --- ending it: timeout, cancellation, the cluster, the runtime's stop -------------------


def test_a_timeout_ends_the_whole_group_sigkill_after_the_grace(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    # Both the shell and its child ignore SIGTERM; only SIGKILL ends them.
    script = "trap '' TERM; sleep 60 & echo $! $$; wait; sleep 60"
    began = time.monotonic()
    result = run_attempt(spec("sh", "-c", script, timeout=1.0), link, tmp_path)
    took = time.monotonic() - began
    assert result["ended_because"] == "timeout"
    assert result["exit_code"] is None and result["signal"] == signal.SIGKILL
    child, shell = printed_pids(link, pids)
    assert gone(child) and gone(shell)
    assert 1.0 + KILL_GRACE <= took < 1.0 + KILL_GRACE + 5
    assert not workdirs()


def test_a_timeout_ends_a_command_that_obeys_sigterm_without_waiting_the_grace(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    began = time.monotonic()
    result = run_attempt(spec("sh", "-c", "echo $$; exec sleep 60", timeout=0.5), link, tmp_path)
    assert time.monotonic() - began < 0.5 + KILL_GRACE
    assert (result["ended_because"], result["signal"]) == ("timeout", signal.SIGTERM)
    assert all(gone(pid) for pid in printed_pids(link, pids))


def test_whatever_the_command_leaves_in_its_group_ends_with_it(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    result = run_attempt(spec("sh", "-c", "sleep 60 > /dev/null & echo $!"), link, tmp_path)
    assert result["exit_code"] == 0
    assert all(gone(pid) for pid in printed_pids(link, pids))


def test_cancelling_the_activity_kills_its_process_and_heartbeats_came_every_second(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    env = ActivityEnvironment()
    beats: list[float] = []
    env.on_heartbeat = lambda *details: beats.append(time.monotonic())
    fn = activity_for(tmp_path, link)

    async def main() -> None:
        task = asyncio.create_task(env.run(fn, spec("sh", "-c", "echo $$; exec sleep 60")))
        deadline = time.monotonic() + ATTEMPT_BOUND
        while not (link.sent and len(beats) >= 3):
            assert time.monotonic() < deadline and not task.done()
            await asyncio.sleep(0.05)
        env.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, ATTEMPT_BOUND)

    asyncio.run(main())
    (pid,) = printed_pids(link, pids)
    assert gone(pid)
    assert not workdirs()
    gaps = [b - a for a, b in itertools.pairwise(beats)]
    assert all(0.8 < gap < 1.5 for gap in gaps), gaps


def test_an_ack_that_says_ended_kills_the_process_and_fails_the_attempt(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink(answers=[Ack(stored=False, reason="ended")])
    with pytest.raises(ApplicationError) as raised:
        run_attempt(spec("sh", "-c", "echo $$; exec sleep 60"), link, tmp_path)
    assert raised.value.type == "AttemptEnded" and raised.value.non_retryable
    (pid,) = printed_pids(link, pids)
    assert gone(pid)
    assert len(link.sent) == 1, "nothing more is sent for an attempt that has ended"
    assert not workdirs()


def test_unavailable_and_lost_acks_are_retried_a_second_later_with_the_same_seq(
    tmp_path: Path,
) -> None:
    link = FakeLink(answers=[Ack(stored=False, reason="unavailable"), LinkDown])
    result = run_attempt(spec("sh", "-c", "echo hi"), link, tmp_path)
    assert result["output_complete"] is True
    assert [m["seq"] for m in link.messages()] == [0, 0, 0]
    assert link.text() == "hi\n"
    times = [at for at, _ in link.sent]
    assert all(b - a >= output.RETRY_AFTER for a, b in itertools.pairwise(times))


def test_after_giving_up_the_output_is_dropped_and_the_command_runs_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(output, "GIVE_UP_AFTER", 1.5)
    monkeypatch.setattr(output, "RETRY_AFTER", 0.2)
    link = FakeLink(answers=[Ack(stored=False, reason="unavailable")] * 100)
    script = "echo first; sleep 2; echo second; exit 5"
    result = run_attempt(spec("sh", "-c", script), link, tmp_path)
    assert result["exit_code"] == 5 and result["output_complete"] is False
    assert {m["seq"] for m in link.messages()} == {0}, "nothing after the seq given up on"
    assert 5 <= len(link.sent) <= 10


def test_the_cap_keeps_one_mib_then_marks_the_cut_and_drops_the_rest(tmp_path: Path) -> None:
    link = FakeLink()
    # Three times the cap: the command must not block on a full pipe once it is reached.
    result = run_attempt(
        spec("sh", "-c", f"head -c {3 * output.OUTPUT_CAP} /dev/zero; echo tail >&2"),
        link,
        tmp_path,
    )
    assert result["exit_code"] == 0
    assert result["truncated"] is True and result["output_bytes"] == output.OUTPUT_CAP
    assert result["output_complete"] is True
    messages = link.messages()
    data = [base64.b64decode(m["data"]) for m in messages]
    assert sum(len(d) for d in data) == output.OUTPUT_CAP == 1 << 20
    assert max(len(d) for d in data) == output.MESSAGE_DATA == 32 << 10
    marker = messages[-1]
    assert (marker["data"], marker["truncated"], marker["stream"]) == ("", True, "stdout")
    assert not any(m["truncated"] for m in messages[:-1])
    assert link.text("stderr") == "", "after the cap, nothing more"
    # A full message stays well inside the edge's 64 KiB message limit.
    biggest = max(len(json.dumps({"type": "job_output", **m})) for m in messages)
    assert biggest < 64 << 10


def test_the_runtime_stopping_ends_an_attempt_with_node_stopping(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    attempts = RunningAttempts()
    fn = activity_for(tmp_path, link, attempts)

    async def main() -> None:
        task = asyncio.create_task(
            ActivityEnvironment().run(fn, spec("sh", "-c", "echo $$; exec sleep 60"))
        )
        while not link.sent:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        await attempts.stop_all()
        (pid,) = printed_pids(link, pids)
        assert gone(pid), "stop_all returns once the processes are gone"
        with pytest.raises(ApplicationError) as raised:
            await asyncio.wait_for(task, ATTEMPT_BOUND)
        assert raised.value.type == NODE_STOPPING and raised.value.non_retryable
        with pytest.raises(ApplicationError, match="stopping"):
            await ActivityEnvironment().run(fn, spec("true", attempt=2))

    asyncio.run(main())
    assert not workdirs()


class RuntimeWithAnAttempt(NodeRuntime):
    """The real runtime's stop; where its Temporal worker would be, one real attempt and a
    stand-in that records what was left of the attempt's processes when it was told."""

    def __init__(self, settings: RuntimeSettings, raw: dict[str, Any], link: FakeLink) -> None:
        super().__init__(settings)
        self.raw, self.link = raw, link
        self.pgid: int | None = None
        self.left_when_worker_stopped: list[int] | None = None
        self.outcome: BaseException | None = None

    async def _serve(self, token: trio.lowlevel.TrioToken, running: Callable[[], None]) -> None:
        assert self.settings.output is not None
        fn = activity_for(self.settings.identity.data_dir, self.link, self.attempts)
        task = asyncio.create_task(ActivityEnvironment().run(fn, self.raw))
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            assert self.pgid is not None
            self.left_when_worker_stopped = members(self.pgid)
            try:
                await asyncio.wait_for(task, ATTEMPT_BOUND)
            except ApplicationError as e:
                self.outcome = e
            raise


async def test_the_runtimes_stop_ends_every_attempt_before_its_worker(
    tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    settings = RuntimeSettings(
        node_id=NODE_ID,
        namespace="default",
        temporal="127.0.0.1:1",
        identity=IdentityDir(tmp_path),
        cluster="test",
        output=link,
    )
    # It ignores SIGTERM: only the SIGKILL after the grace ends it.
    raw = spec("sh", "-c", "trap '' TERM; echo $$; sleep 60")
    runtime = RuntimeWithAnAttempt(settings, raw, link)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.run, lambda: None)
        assert await trio.to_thread.run_sync(link.first_sent.wait, ATTEMPT_BOUND)
        (runtime.pgid,) = printed_pids(link, pids)
        began = trio.current_time()
        await runtime.stop()
        took = trio.current_time() - began
    assert runtime.left_when_worker_stopped == [], "its processes were gone first"
    assert isinstance(runtime.outcome, ApplicationError)
    assert runtime.outcome.type == NODE_STOPPING
    assert gone(runtime.pgid)
    assert KILL_GRACE <= took < STOP_TIMEOUT
    assert not workdirs()


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
    began = trio.current_time()
    with pytest.raises(LinkDown, match="did not take a job_output within 2 s"):
        await send_bounded(StuckConn(), {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0
    with pytest.raises(LinkDown, match="closed the connection"):
        await send_bounded(StuckConn(fail=True), {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0


@dataclass
class RecordingConn:
    address: str = "edge-a:7443"
    sent: list[tuple[str, dict[str, object]]] = field(default_factory=list)
    # Called after each send, in Trio (to answer it).
    then: Callable[[dict[str, object]], None] = lambda fields: None

    async def send(self, kind: str, **fields: object) -> None:
        self.sent.append((kind, fields))
        self.then(fields)


FIELDS: dict[str, object] = {
    "job": JOB,
    "attempt": 1,
    "seq": 0,
    "stream": "stdout",
    "data": "aGk=",
    "truncated": False,
}


def exchange_in_asyncio(link: StreamLink, within: float) -> Ack | None:
    async def exchange() -> Ack | None:
        return await link.exchange(FIELDS, within)

    return asyncio.run(exchange())


async def test_the_link_sends_from_asyncio_through_trio_and_hands_back_the_ack(
    caplog: pytest.LogCaptureFixture,
) -> None:
    conn = RecordingConn()
    link = StreamLink(conn, trio.lowlevel.current_trio_token())

    def answer(fields: dict[str, object]) -> None:
        ids = {k: fields[k] for k in ("job", "attempt", "seq")}
        link.deliver({"type": "job_output_ack", **ids, "seq": 7, "stored": True})  # nobody's
        link.deliver({"type": "job_output_ack", **ids, "stored": "yes"})  # malformed
        link.deliver({"type": "job_output_ack", **ids, "stored": False, "reason": "ended"})

    conn.then = answer
    with trio.fail_after(10):
        ack = await trio.to_thread.run_sync(exchange_in_asyncio, link, 5.0)
    assert ack == Ack(stored=False, reason="ended")
    assert conn.sent == [("job_output", FIELDS)]
    assert "malformed job_output_ack" in caplog.text
    # No answer: None once WITHIN is up, and nobody waits any more.
    conn.then = lambda fields: None
    with trio.fail_after(10):
        assert await trio.to_thread.run_sync(exchange_in_asyncio, link, 0.2) is None
    assert link._waiting == {}


@dataclass(eq=False)
class AttemptRuntime:
    """A runtime whose worker runs one real attempt, over the stream it was handed."""

    settings: RuntimeSettings
    raw: dict[str, Any]
    outcomes: list[object]
    done: trio.Event

    async def run(self, running: Callable[[], None]) -> None:
        running()
        link = self.settings.output
        assert isinstance(link, StreamLink)
        fn = attempt_activity(
            self.settings.node_id,
            self.settings.identity.data_dir,
            link,
            RunningAttempts(),
            grant_check(self.settings),
        )

        def in_asyncio() -> object:
            async def attempt() -> object:
                return await ActivityEnvironment().run(fn, self.raw)

            try:
                return asyncio.run(attempt())
            except ApplicationError as e:
                return e

        self.outcomes.append(await trio.to_thread.run_sync(in_asyncio))
        self.done.set()
        await trio.sleep_forever()

    async def stop(self) -> None:
        pass


@pytest.fixture
async def net(nursery: trio.Nursery) -> AsyncIterator[FakeNet]:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    cluster.temporal = "edge-a:7233"
    yield FakeNet(cluster, nursery)


async def attempt_over_the_stream(net: FakeNet, data: Path, raw: dict[str, Any]) -> object:
    outcomes: list[object] = []
    done = trio.Event()

    def factory(settings: RuntimeSettings) -> AttemptRuntime:
        # Signed as the cluster signs it for this node, in its tenant.
        grant = signed(raw, net.cluster.ca, node_id=settings.node_id, tenant=settings.namespace)
        return AttemptRuntime(settings, grant, outcomes, done)

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
            await done.wait()
            nursery.cancel_scope.cancel()
    return outcomes[0]


async def test_the_agent_hands_its_stream_to_the_runtime_and_routes_the_edges_acks(
    net: FakeNet, tmp_path: Path
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    result = await attempt_over_the_stream(
        net, data, unsigned("sh", "-c", 'echo "$OZ0_NODE_ID"; echo oops >&2')
    )
    assert isinstance(result, dict)
    assert result["exit_code"] == 0 and result["output_complete"] is True
    sent = [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "job_output"]
    got = {(m["stream"], base64.b64decode(m["data"])) for m in sent}
    assert got == {("stdout", f"{node_id}\n".encode()), ("stderr", b"oops\n")}
    assert sorted(m["seq"] for m in sent) == list(range(len(sent)))

    net.cluster.job_output_ack = {"stored": False, "reason": "ended"}
    net.cluster.events.clear()
    ended = await attempt_over_the_stream(
        net, data, unsigned("sh", "-c", "echo x; exec sleep 60", attempt=2)
    )
    assert isinstance(ended, ApplicationError) and ended.type == "AttemptEnded"


def test_logging_names_the_attempt(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="oz0_node.jobs")
    run_attempt(spec("true"), FakeLink(), tmp_path)
    assert f"job {JOB} attempt 1: started process" in caplog.text


def test_the_runtime_offers_the_job_activity_only_with_an_output_link(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path)
    identity.create()
    identity.save_ca(pki.cert_to_pem(CLUSTER_CA.cert))

    def names(output: FakeLink | None) -> list[str]:
        settings = RuntimeSettings(
            node_id=NODE_ID,
            namespace="default",
            temporal="127.0.0.1:1",
            identity=identity,
            cluster="test",
            output=output,
        )
        defns = map(activity._Definition.must_from_callable, NodeRuntime(settings)._activities())
        return [str(defn.name) for defn in defns]

    assert names(FakeLink()) == ["oz0.node.describe", ACTIVITY]
    assert names(None) == ["oz0.node.describe"]


def test_the_runtime_stopping_cuts_the_final_flush_short(tmp_path: Path) -> None:
    link = FakeLink(answers=[None])  # the edge never acks the first message
    attempts = RunningAttempts()
    fn = activity_for(tmp_path, link, attempts)

    async def main() -> tuple[dict[str, object], float]:
        task = asyncio.create_task(ActivityEnvironment().run(fn, spec("sh", "-c", "echo hi")))
        while not link.sent:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
        began = time.monotonic()
        await attempts.stop_all()
        return await asyncio.wait_for(task, ATTEMPT_BOUND), time.monotonic() - began

    result, took = asyncio.run(main())
    assert took < 2.0, "stop_all did not wait for the flush"
    assert result["exit_code"] == 0 and result["output_complete"] is False
    assert not workdirs()


def test_a_working_directory_that_cannot_be_made_fails_the_attempt_clearly(
    tmp_path: Path,
) -> None:
    isolation = Isolation.detect(tmp_path)
    isolation.temp_dir = tmp_path / "a-file"
    isolation.temp_dir.write_text("a file where the directory belongs")
    fn = attempt_activity(
        NODE_ID, tmp_path, FakeLink(), RunningAttempts(), grants_for(tmp_path), isolation
    )
    with pytest.raises(ApplicationError, match="cannot make its working directory") as raised:
        asyncio.run(ActivityEnvironment().run(fn, spec("true")))
    assert raised.value.type == "NoWorkingDirectory" and raised.value.non_retryable


# --- isolation: the job user, nothing outlives its attempt, limits, a crash's leftovers ------

TRACKINGS = [CGROUP_V2, SUBREAPER]


def isolation_for(data_dir: Path, tracking: str) -> Isolation:
    """This machine's isolation, tracking as TRACKING. cgroup v2 can be used here (its
    hierarchy at /sys/fs/cgroup/unified, writable by root): the test says so if it is not."""
    isolation = Isolation.detect(data_dir, tracking=tracking)
    assert isolation.tracking == tracking, f"this machine gives {isolation.tracking}"
    return isolation


def run_isolated(
    raw: dict[str, Any], link: FakeLink, data_dir: Path, isolation: Isolation
) -> dict[str, object]:
    fn = attempt_activity(
        NODE_ID, data_dir, link, RunningAttempts(), grants_for(data_dir), isolation
    )

    async def main() -> dict[str, object]:
        return await asyncio.wait_for(ActivityEnvironment().run(fn, raw), ATTEMPT_BOUND)

    return asyncio.run(main())


def all_gone(numbers: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while not all(gone(pid) for pid in numbers):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


# Left behind three ways: a new session, a double fork, nohup in a grandchild.
LEAVE_BEHIND = (
    "setsid sleep 600 & echo $!; (sleep 600 & echo $!); "
    "sh -c 'nohup sleep 600 >/dev/null 2>&1 & echo $!'"
)


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_what_an_attempt_left_setsid_or_double_forked_is_gone_when_it_ends(
    tracking: str, tmp_path: Path, pids: list[int]
) -> None:
    link = FakeLink()
    result = run_isolated(
        spec("sh", "-c", LEAVE_BEHIND), link, tmp_path, isolation_for(tmp_path, tracking)
    )
    assert result["exit_code"] == 0, link.text("stderr")
    assert result["applied"] == {"user": DEFAULT_JOB_USER, "tracking": tracking, "limits": {}}
    left = printed_pids(link, pids)
    assert len(left) == 3
    assert all_gone(left, 5.0), f"{tracking}: still running after the attempt ended"
    assert not list(Path("/sys/fs/cgroup/unified").glob(f"oz0-node-{NODE_ID}"))


def test_a_job_cannot_read_the_nodes_identity(tmp_path: Path) -> None:
    identity = tmp_path / "identity"
    identity.mkdir(mode=0o700)
    (identity / "node.key").write_text("THE-NODE-KEY")
    link = FakeLink()
    result = run_attempt(spec("cat", str(identity / "node.key")), link, tmp_path)
    assert result["exit_code"] != 0
    assert "THE-NODE-KEY" not in link.text() + link.text("stderr")
    assert "Permission denied" in link.text("stderr")


# Allocates 400 MiB, written (not just reserved), then says so.
ALLOCATE = "a = [b'x' * (1 << 20) for _ in range(400)]; print('allocated')"


def test_a_memory_limit_stops_an_allocation_loop_and_the_result_says_how_limits_applied(
    tmp_path: Path,
) -> None:
    link = FakeLink()
    limits = {"memory": 64 << 20, "max_open_files": 64, "address_space": 4 << 30}
    raw = sign({**unsigned("sh", "-c", f'ulimit -n; python3 -c "{ALLOCATE}"'), "limits": limits})
    result = run_attempt(raw, link, tmp_path)
    # This machine has cgroup v1's memory controller (cgroup v2 has none here): the cgroup's
    # OOM killer ends the loop with SIGKILL.
    applied = result["applied"]
    assert isinstance(applied, dict)
    assert applied["limits"] == {
        "memory": "cgroup v1",
        "max_open_files": "rlimit",
        "address_space": "rlimit",
    }
    assert link.text().splitlines()[0] == "64"
    assert "allocated" not in link.text()
    assert result["exit_code"] == 128 + signal.SIGKILL, link.text("stderr")


# Runs one attempt with a link that prints its output, as an agent would, until killed.
CRASHING_AGENT = """
import asyncio, base64, sys
from pathlib import Path
from temporalio.testing import ActivityEnvironment
from oz0_node.jobs.attempt import RunningAttempts, attempt_activity
from cryptography import x509
from oz0_node.jobs.grants import GrantCheck, RunRecord
from oz0_node.jobs.isolation import Isolation

class Link:
    async def exchange(self, fields, within):
        sys.stdout.write(base64.b64decode(fields["data"]).decode())
        sys.stdout.flush()
        return None

data, tracking, raw = Path(sys.argv[1]), sys.argv[2], eval(sys.argv[3])
isolation = Isolation.detect(data, tracking=tracking)
ca = x509.load_pem_x509_certificate(Path(sys.argv[5]).read_bytes())
grants = GrantCheck(
    cluster="test", tenant="default", node_id=sys.argv[4], ca=ca, record=RunRecord.load(data)
)
fn = attempt_activity(sys.argv[4], data, Link(), RunningAttempts(), grants, isolation)
asyncio.run(ActivityEnvironment().run(fn, raw))
"""


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_after_a_crash_the_next_start_ends_what_its_attempts_left_and_removes_their_directories(
    tracking: str, tmp_path: Path, pids: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    raw = spec("sh", "-c", f"{LEAVE_BEHIND}; echo $$ $PWD; sleep 600")
    ca = tmp_path.parent / f"{tmp_path.name}-ca.pem"
    ca.write_bytes(pki.cert_to_pem(CLUSTER_CA.cert))
    crashing = subprocess.Popen(
        [
            sys.executable,
            "-c",
            CRASHING_AGENT,
            str(tmp_path),
            tracking,
            repr(raw),
            NODE_ID,
            str(ca),
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        assert crashing.stdout is not None
        lines = [crashing.stdout.readline() for _ in range(4)]
        *left, shell_and_dir = lines
        shell, workdir = shell_and_dir.split()
        numbers = [int(n) for n in left] + [int(shell)]
        pids.extend(numbers)
        # A subreaper's tracking records what it found at its last look.
        time.sleep(2 * SCAN_EVERY + 0.2)
    finally:
        crashing.kill()
        crashing.wait()
        if crashing.stdout is not None:
            crashing.stdout.close()
    assert not any(gone(pid) for pid in numbers), "the crash left them running"
    caplog.set_level(logging.INFO, logger="oz0_node.jobs")
    assert isolation_for(tmp_path, tracking).end_leftovers(NODE_ID) == 1
    assert all_gone(numbers, 5.0), f"{tracking}: a crash's leftovers still run"
    assert not Path(workdir).exists()
    assert f"attempt {JOB}-1 of a previous agent process: ended" in caplog.text
    assert not (tmp_path / RECORD_FILE).exists()


def test_a_recorded_pid_now_used_by_another_process_is_never_touched(
    tmp_path: Path, pids: list[int]
) -> None:
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
