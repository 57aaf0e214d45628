"""The soak's checker (bench/soak_check.py) on hand-made ledgers and records, one test per
kind of violation, and its ledger as the wrapper (bench/soak_ledger.py) writes it. No
servers: the soak itself is tests/test_soak.py."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

from bench.soak_check import check, rss_changes
from bench.soak_ledger import LEDGER_PARENT, ledger
from bench.soak_model import (
    AttemptRecord,
    BadLedger,
    BlockProbe,
    Change,
    Exit,
    FaultSpan,
    HostExit,
    JobRecord,
    PushedFile,
    PushRecord,
    Records,
    Run,
    Sample,
    SessionRecord,
    read_ledger,
)

T0 = 1_800_000_000.0
HELLO = hashlib.sha256(b"hello\n").hexdigest()


def ok_run(job: str = "job-a", attempt: int = 1, node: str = "node-1", pid: int = 10) -> Run:
    return Run(job, attempt, node, pid, T0 + 5, T0 + 6, 0, HELLO, 6)


def ok_job(job: str = "job-a", *attempts: AttemptRecord, state: str = "succeeded") -> JobRecord:
    listed = attempts or (AttemptRecord(1, 0, "node-1", "ended", 0, "exit", False, HELLO),)
    return JobRecord(job, state, T0 + 100, listed)


def records(**changes: object) -> Records:
    base = Records(runs=[ok_run()], jobs=[ok_job()], started_at=T0, checked_at=T0 + 60)
    for name, value in changes.items():
        setattr(base, name, value)
    return base


def kinds(found: Records) -> list[str]:
    return [v.kind for v in check(found)]


def test_a_clean_history_has_no_violation() -> None:
    assert check(records()) == []


def test_a_job_not_ended_past_its_bound() -> None:
    running = JobRecord("job-a", "running", T0 + 30, ok_job().attempts)
    assert kinds(records(jobs=[running])) == ["not_terminal"]
    # Within its bound it may still run.
    assert kinds(records(jobs=[running], checked_at=T0 + 20)) == []


def test_an_attempt_started_twice() -> None:
    again = Run("job-a", 1, "node-1", 11, T0 + 7, T0 + 8, 0, HELLO, 6)
    assert kinds(records(runs=[ok_run(), again])) == ["ran_twice"]


def test_a_run_the_job_does_not_list() -> None:
    elsewhere = ok_run(node="node-2")
    unknown = ok_run(job="job-zzz")
    assert kinds(records(runs=[ok_run(), elsewhere])) == ["ran_twice", "unlisted_run"]
    assert kinds(records(runs=[ok_run(), unknown])) == ["unlisted_run"]


def test_a_success_the_ledger_does_not_show() -> None:
    failed = Run("job-a", 1, "node-1", 10, T0 + 5, T0 + 6, 3, HELLO, 6)
    assert kinds(records(runs=[failed])) == ["false_success", "false_success"]
    killed = Run("job-a", 1, "node-1", 10, T0 + 5)
    assert kinds(records(runs=[killed])) == ["false_success"]
    assert kinds(records(runs=[])) == ["false_success"]
    # A job that failed may have anything in the ledger but another exit code.
    failed_job = ok_job(
        "job-a", AttemptRecord(1, 0, "node-1", "ended", 3, "exit", False, HELLO), state="failed"
    )
    assert kinds(records(runs=[failed], jobs=[failed_job])) == []


def test_output_that_differs_from_the_digest() -> None:
    lost = AttemptRecord(1, 0, "node-1", "ended", 0, "exit", False, hashlib.sha256(b"").hexdigest())
    assert kinds(records(jobs=[ok_job("job-a", lost)])) == ["output_differs"]
    truncated = AttemptRecord(1, 0, "node-1", "ended", 0, "exit", True, None)
    assert kinds(records(jobs=[ok_job("job-a", truncated)])) == []
    # An attempt its node's block ended keeps what came before; its job moved on.
    moved = AttemptRecord(1, 0, "node-1", "ended", None, "node blocked", False, None)
    assert kinds(records(jobs=[ok_job("job-a", moved, state="failed")])) == []


def test_a_placed_file_whose_digest_the_command_did_not_print() -> None:
    """`job run --file`: the command prints its file's SHA-256 alone, known beforehand;
    the ledger's digest of a run that ended 0 must be that line's (a wrong or missing file
    prints another)."""
    line = b"f" * 64 + b"\n"
    expect = hashlib.sha256(line).hexdigest()
    right = Run("job-a", 1, "node-1", 10, T0 + 5, T0 + 6, 0, expect, 65)
    stored = AttemptRecord(1, 0, "node-1", "ended", 0, "exit", False, expect, 65)
    placed = JobRecord("job-a", "succeeded", T0 + 100, (stored,), expect=expect)
    assert kinds(records(runs=[right], jobs=[placed])) == []
    # The output stored is the command's (so the digests agree), but not the file's.
    wrong = Run("job-a", 1, "node-1", 10, T0 + 5, T0 + 6, 0, HELLO, 6)
    told = AttemptRecord(1, 0, "node-1", "ended", 0, "exit", False, HELLO, 6)
    other = JobRecord("job-a", "succeeded", T0 + 100, (told,), expect=expect)
    assert kinds(records(runs=[wrong], jobs=[other])) == ["output_differs"]
    # A run that failed (its file refused, say) is the job's to report, not this check's.
    failed = Run("job-a", 1, "node-1", 10, T0 + 5, T0 + 6, 1, HELLO, 6)
    told = AttemptRecord(1, 0, "node-1", "ended", 1, "exit", False, HELLO, 6)
    lost = JobRecord("job-a", "failed", T0 + 100, (told,), expect=expect)
    assert kinds(records(runs=[failed], jobs=[lost])) == []


def test_a_pushed_file_that_is_not_on_its_node() -> None:
    sha = hashlib.sha256(b"content").hexdigest()
    push = JobRecord(
        "job-p", "succeeded", T0 + 100,
        (AttemptRecord(1, 0, "node-1", "ended", 0, "exit"),
         AttemptRecord(2, 1, "node-2", "ended", 0, "exit")),
        ledgered=False,
    )  # fmt: skip
    good = PushRecord(
        "job-p", 1.0, sha,
        (PushedFile("node-1", 1, "written", sha), PushedFile("node-2", 2, "unchanged", sha)),
    )  # fmt: skip
    # A push runs no command: no ledger run is no false success.
    assert kinds(records(jobs=[ok_job(), push], pushes=[good])) == []
    missing = PushRecord("job-p", 1.0, sha, (PushedFile("node-1", 1, "written", None),))
    other = PushRecord("job-p", 1.0, sha, (PushedFile("node-2", 2, "unchanged", HELLO),))
    assert kinds(records(pushes=[missing, other])) == ["file_differs", "file_differs"]
    # A node that said it failed is not judged by its disk.
    failed = PushedFile("node-1", 1, "error: No space left on device", None)
    assert kinds(records(pushes=[PushRecord("job-p", 1.0, sha, (failed,))])) == []


def test_a_session_whose_recording_lost_output() -> None:
    """The ledger's run of a session (the session's ID as its job, attempt 1); the
    recording must begin with what the soak was shown, and when the session ended by its
    command's exit, hold exactly what the command printed."""
    run = Run("session-1", 1, "node-1", 12, T0 + 5, T0 + 6, 0, HELLO, 6)
    fine = SessionRecord("session-1", "node-1", 1.0, b"hello\n", 0, False, b"hello\n")
    assert kinds(records(runs=[ok_run(), run], sessions=[fine])) == []
    shown_lost = SessionRecord("session-1", "node-1", 1.0, b"hello\n", None, False, b"hel")
    assert kinds(records(runs=[ok_run(), run], sessions=[shown_lost])) == ["session_lost"]
    # Shown nothing (the soak's websocket broke), ended by its exit, recorded short.
    cut = SessionRecord("session-1", "node-1", 1.0, b"", 0, False, b"hel")
    assert kinds(records(runs=[ok_run(), run], sessions=[cut])) == ["session_lost"]
    # Its server stopped under it: what was recorded was shown; no exit, not judged.
    broken = SessionRecord("session-1", "node-1", 1.0, b"hel", None, False, b"hel")
    assert kinds(records(runs=[ok_run(), run], sessions=[broken])) == []
    unread = SessionRecord("session-1", "node-1", 1.0, b"hello\n", 0, False, None)
    assert kinds(records(runs=[ok_run(), run], sessions=[unread])) == []
    # A run the cluster lists as no session (nor job), or on another node, is unlisted.
    assert kinds(records(runs=[ok_run(), run])) == ["unlisted_run"]
    elsewhere = SessionRecord("session-1", "node-2", 1.0, b"", 0, False, b"hello\n")
    assert kinds(records(runs=[ok_run(), run], sessions=[elsewhere])) == ["unlisted_run"]


def test_a_change_without_its_audit_row() -> None:
    change = Change("node.block", "node:node-1", 1.0)
    assert kinds(records(changes=[change])) == ["audit_missing"]
    assert kinds(records(changes=[change], audit={("node.block", "node:node-1")})) == []


def test_a_block_slower_than_two_seconds() -> None:
    assert kinds(records(blocks=[BlockProbe("node-1", 1.0, 0.4)])) == []
    assert kinds(records(blocks=[BlockProbe("node-1", 1.0, 2.5)])) == ["slow_block"]
    assert kinds(records(blocks=[BlockProbe("node-1", 1.0, None)])) == ["slow_block"]
    paused = BlockProbe("node-1", 1.0, 9.0, 0.1, "its stream was on 127.0.0.44, stopped")
    assert kinds(records(blocks=[paused])) == []


def test_a_block_that_temporal_took_longer_than_two_seconds_to_refuse() -> None:
    """The stream closed in time, but a server's Temporal took the node's calls on (or
    never stopped): the block's effect is the latest of them, on every server judged."""
    quick = (("127.0.0.44", 0.3), ("127.0.0.45", 0.5))
    assert kinds(records(blocks=[BlockProbe("node-1", 1.0, 0.4, 0.1, None, quick)])) == []
    slow = BlockProbe("node-1", 1.0, 0.4, 0.1, None, (*quick, ("127.0.0.46", 2.6)))
    [found] = check(records(blocks=[slow]))
    assert found.kind == "slow_block" and "after 2.60 s" in found.detail
    assert "Temporal on 127.0.0.46 2.60 s" in found.detail
    never = BlockProbe("node-1", 1.0, 0.4, 0.1, None, (*quick, ("127.0.0.46", None)))
    [found] = check(records(blocks=[never]))
    assert "took effect never" in found.detail and "127.0.0.46 never" in found.detail


def test_an_unplanned_exit() -> None:
    planned = Exit("server 127.0.0.44", 1.0, -9, True)
    assert kinds(records(exits=[planned])) == []
    assert kinds(records(exits=[Exit("server 127.0.0.45", 2.0, 1, False)])) == ["unplanned_exit"]


def test_an_unplanned_exit_of_a_temporal_host() -> None:
    """A server's Temporal host gone while its server ran on: explained by a
    temporal_host_kill of that server, a stop of the server (planned or not: an unplanned
    one is its own violation), not by a fault elsewhere or long before."""
    host = HostExit("127.0.0.45", 4242, 2.0)
    killed = FaultSpan("temporal_host_kill", "127.0.0.45", 1.99, 1.99)
    stopped = FaultSpan("server_kill", "127.0.0.45", 1.9, 2.3)
    assert kinds(records(host_exits=[host], faults=[killed])) == []
    assert kinds(records(host_exits=[host], faults=[stopped])) == []
    server_died = Exit("server 127.0.0.45", 2.01, 1, False)
    assert kinds(records(host_exits=[host], exits=[server_died])) == ["unplanned_exit"]
    elsewhere = FaultSpan("temporal_host_kill", "127.0.0.44", 1.99, 1.99)
    long_before = FaultSpan("temporal_host_kill", "127.0.0.45", 0.5, 0.5)
    paused = FaultSpan("server_pause", "127.0.0.45", 1.8, 2.1)
    for unexplained in (elsewhere, long_before, paused):
        [found] = check(records(host_exits=[host], faults=[unexplained]))
        assert found.kind == "unplanned_exit" and found.minute == 2.0
        assert "Temporal host of server 127.0.0.45 (pid 4242)" in found.detail


def test_memory_that_grew_past_a_fifth() -> None:
    def series(name: str, pid: int, values: list[float], start: float = 0.0) -> list[Sample]:
        step = 6.0 / len(values)
        return [Sample(name, pid, start + i * step, v) for i, v in enumerate(values)]

    flat = series("server a", 1, [100.0] * 60)
    grew = series("agent 3", 2, [100.0] * 30 + [130.0] * 30)
    # Warm-up before the reference (a sixth of the run) does not count.
    warm = series("server b", 3, [50.0] * 10 + [100.0] * 50)
    # A process restarted after the reference is not judged.
    late = series("server c", 4, [100.0] * 10 + [200.0] * 10, start=4.0)
    found = check(records(rss=flat + grew + warm + late, minutes=6.0))
    assert [(v.kind, v.detail.split(" (")[0]) for v in found] == [("rss_growth", "agent 3")]
    # The report's memory: every process judged, with its two medians.
    changes = {
        c.name: (c.before, c.after)
        for c in rss_changes(records(rss=flat + grew + warm + late, minutes=6.0))
    }
    assert changes == {
        "server a": (100.0, 100.0),
        "agent 3": (100.0, 130.0),
        "server b": (100.0, 100.0),
    }


def test_database_connections_past_their_bound() -> None:
    readings = [(0.5, 40), (1.0, 61), (1.5, 70)]
    found = check(records(connections=readings, connection_bound=60))
    assert [v.kind for v in found] == ["db_connections"]
    assert "70 database connections" in found[0].detail
    assert check(records(connections=readings, connection_bound=80)) == []


def test_a_ledger_line_that_does_not_parse_is_an_error() -> None:
    with pytest.raises(BadLedger):
        read_ledger("start\tjob-a\tx\tnode-1\t10\t1.0\n")
    with pytest.raises(BadLedger):
        read_ledger("end\tjob-a\t1\tnode-1\t10\t2.0\t0\tabc\t3\n")  # no start


def test_a_run_whose_output_the_wrapper_lost_has_no_digest() -> None:
    text = "start\tjob-a\t1\tnode-1\t10\t1.0\nend\tjob-a\t1\tnode-1\t10\t2.0\t125\t-\t-\n"
    (run,) = read_ledger(text)
    assert (run.status, run.digest, run.size) == (125, None, None)


def test_the_wrapper_writes_what_the_checker_reads() -> None:
    """The wrapper run as another UID than the ledger's owner (when root), with its own
    TMPDIR: its two lines, the exit status and the digest of its stdout only. The ledger
    where the soak keeps it (/run when root: pytest's temporary directories are 0700)."""
    parent = LEDGER_PARENT if os.geteuid() == 0 else Path(tempfile.gettempdir())
    with ledger(parent) as made, tempfile.TemporaryDirectory() as work:
        Path(work).chmod(0o777)
        env = {
            "PATH": "/usr/bin:/bin", "OZ0_JOB_ID": "job-a", "OZ0_ATTEMPT": "2",
            "OZ0_NODE_ID": "node-1", "TMPDIR": work,
        }  # fmt: skip
        as_other = (
            ["setpriv", "--reuid", "61999", "--regid", "61999", "--clear-groups"]
            if os.geteuid() == 0
            else []
        )
        command = made.wrapped(["sh", "-c", "echo hello; echo noise >&2; exit 3"])
        done = subprocess.run([*as_other, *command], env=env, capture_output=True, timeout=30)
        assert (done.returncode, done.stdout, done.stderr) == (3, b"hello\n", b"noise\n")
        (run,) = read_ledger(made.read())
    assert (run.job, run.attempt, run.node, run.status, run.digest, run.size) == (
        "job-a", 2, "node-1", 3, HELLO, 6
    )  # fmt: skip
    assert run.end is not None and run.start <= run.end
