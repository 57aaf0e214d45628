"""An attempt the node runs, through the real `oz0.job.attempt` hand-over, its attempt
manager and a real supervisor, with a fake edge on the other end of the link
(fixtures/node_attempts.py): its output and exit code, its environment, its directory,
and an attempt refused for being malformed.

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import pwd
import re
import tempfile
from pathlib import Path

import pytest
from temporalio.exceptions import ApplicationError

from fixtures.attempt_processes import own_uid
from fixtures.node_attempts import (
    JOB,
    NODE_ID,
    RecordingEdge,
    handed,
    run_attempt,
    sign,
    spec,
    unsigned,
    workdirs,
)
from oz0_node.jobs import attempt as attempt_module
from oz0_node.jobs import attempt_files, supervisor_client
from oz0_node.jobs.attempt import ACTIVITY
from oz0_node.jobs.isolation import STANDARD_PATH, WORKDIR_PREFIX

# --- output, exit code, environment, directory -------------------------------------------


def test_the_output_and_exit_code_reach_the_result_and_the_edge(tmp_path: Path) -> None:
    edge = RecordingEdge()
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
    result = run_attempt(spec("sh", "-c", "kill -9 $$"), RecordingEdge(), tmp_path)
    assert (result["exit_code"], result["signal"]) == (128 + 9, 9)
    assert result["ended_because"] == "exit"


def test_stdout_and_stderr_stay_apart_and_in_order_one_message_at_a_time(
    tmp_path: Path,
) -> None:
    edge = RecordingEdge()
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
    edge = RecordingEdge()
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
    edge = RecordingEdge()
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
    edge = RecordingEdge()
    result = run_attempt(spec("no-such-command-oz0", "x"), edge, tmp_path)
    assert result["exit_code"] == 127 and result["ended_because"] == "exit"
    assert edge.chunks() == [
        ("stderr", b"oz0-node: cannot run 'no-such-command-oz0': No such file or directory\n")
    ]
    # Where the job sees it (not in /tmp, its own).
    plain = Path(tempfile.mkstemp(prefix="oz0-test-plain-", dir="/dev/shm")[1])
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    edge = RecordingEdge()
    try:
        result = run_attempt(spec(str(plain), attempt=2), edge, tmp_path)
    finally:
        plain.unlink()
    assert result["exit_code"] == 126
    assert edge.text("stderr") == f"oz0-node: cannot run {str(plain)!r}: Permission denied\n"
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
            handed(bad, data_dir)
        assert raised.value.type == "BadAttempt" and raised.value.non_retryable
        assert not workdirs()
        assert not supervisor_client.find_all(data_dir)
