"""How the supervisor starts an attempt's command (oz0_node/jobs/spawn.py): born in its
cgroup v2 by clone3, as the job user, with its rlimits, in a session of its own, stdin
/dev/null, no descriptor but its three, no signal ignored; the errors as Popen gives them;
and the pre-exec path where clone3 cannot be used. Real processes in a real cgroup v2
(this machine's, at /sys/fs/cgroup/unified); runs as root, starts no server and binds no
address."""

from __future__ import annotations

import os
import resource
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oz0_node.jobs import spawn as spawn_module
from oz0_node.jobs.job_user import DEFAULT_JOB_USER, JobUser
from oz0_node.jobs.spawn import ChildSteps, Command, spawn

V2 = Path("/sys/fs/cgroup/unified")
JOB_USER = JobUser.named(DEFAULT_JOB_USER)
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# What the command reports of itself: its cgroup, ids, groups, open-files limit, session,
# descriptors, ignored signals, stdin.
REPORT = (
    "grep '^0::' /proc/self/cgroup; id -u; id -g; id -G; ulimit -n; "
    "cut -d' ' -f6 /proc/self/stat; echo $$; ls /proc/self/fd | sort -n | tr '\\n' ' '; echo; "
    "grep SigIgn /proc/self/status; readlink /proc/self/fd/0"
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or JOB_USER is None or not (V2 / "cgroup.procs").exists(),
    reason="needs root, the job user and a cgroup v2 hierarchy",
)


@pytest.fixture
def cgroup() -> Iterator[Path]:
    path = V2 / f"oz0-test-spawn-{os.getpid()}"
    path.mkdir()
    yield path
    for _ in range(100):
        try:
            path.rmdir()
            return
        except OSError:  # its last process is still being reaped
            time.sleep(0.02)


@pytest.fixture
def popen_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each time the Popen path was taken: whether it had a pre-exec step."""
    calls: list[bool] = []
    real = spawn_module._popen

    def recorded(*args: object) -> subprocess.Popen[bytes]:
        calls.append(args[3] is not None)  # its pre-exec function
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(spawn_module, "_popen", recorded)
    return calls


def run(command: Command) -> tuple[int | None, str, str]:
    assert command.stdout is not None and command.stderr is not None
    out, err = command.stdout.read(), command.stderr.read()
    command.stdout.close()
    command.stderr.close()
    deadline = time.monotonic() + 10
    while command.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    return command.returncode, out.decode(), err.decode()


def steps_for(cgroup: Path, nofile: int = 64) -> ChildSteps:
    return ChildSteps(cgroup=cgroup, rlimits=((resource.RLIMIT_NOFILE, nofile),), user=JOB_USER)


def report(cgroup: Path, tmp_path: Path) -> list[str]:
    tmp_path.chmod(0o755)
    code, out, err = run(
        spawn(["sh", "-c", REPORT], cwd=tmp_path, env={"PATH": PATH}, steps=steps_for(cgroup))
    )
    assert code == 0, err
    return out.splitlines()


@pytest.mark.one_thread  # clone3's child runs Python: fixtures/one_thread.py
def test_the_command_is_born_in_its_cgroup_as_the_job_user_in_a_session_of_its_own(
    cgroup: Path, tmp_path: Path, popen_calls: list[bool]
) -> None:
    assert JOB_USER is not None
    lines = report(cgroup, tmp_path)
    assert popen_calls == [], "clone3, not Popen"
    cgroup_line, uid, gid, groups, nofile, sid, pid, fds, ignored, stdin = lines
    assert cgroup_line == f"0::/{cgroup.relative_to(V2)}"
    assert (int(uid), int(gid)) == (JOB_USER.uid, JOB_USER.gid)
    assert sorted(int(g) for g in groups.split()) == sorted(set(JOB_USER.groups))
    assert nofile == "64"
    assert sid == pid, "a session of its own"
    assert fds.split() == ["0", "1", "2", "3"], "its three, and the one ls opened"
    assert ignored.split() == ["SigIgn:", "0" * 16], "no signal left ignored"
    assert stdin == "/dev/null"


@pytest.mark.one_thread  # clone3's child runs Python: fixtures/one_thread.py
def test_the_command_starts_with_no_signal_ignored_or_blocked_whatever_the_agent_inherited(
    cgroup: Path, tmp_path: Path, popen_calls: list[bool]
) -> None:
    # An agent started by a shell's `&` ignores SIGINT and SIGQUIT, one under nohup SIGHUP;
    # a thread of it may block one. Read by grep itself: a shell clears its mask as it starts.
    inherited = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
    before = [signal.signal(sig, signal.SIG_IGN) for sig in inherited]
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGUSR1,))
    try:
        code, out, err = run(
            spawn(
                ["grep", "-E", "^Sig(Ign|Blk)", "/proc/self/status"],
                cwd=tmp_path,
                env={"PATH": PATH},
                steps=steps_for(cgroup),
            )
        )
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, (signal.SIGUSR1,))
        for sig, handler in zip(inherited, before, strict=True):
            signal.signal(sig, handler)
    assert code == 0, err
    assert popen_calls == [], "clone3, not Popen"
    assert sorted(line.split() for line in out.splitlines()) == [
        ["SigBlk:", "0" * 16],
        ["SigIgn:", "0" * 16],
    ]


@pytest.mark.one_thread  # clone3's child runs Python: fixtures/one_thread.py
def test_the_pre_exec_path_gives_the_command_the_same(
    cgroup: Path, tmp_path: Path, popen_calls: list[bool], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(spawn_module._Clone3, "works", False)
    before = report(cgroup, tmp_path)
    monkeypatch.setattr(spawn_module._Clone3, "works", True)
    after = report(cgroup, tmp_path)
    assert popen_calls == [True]
    # All but its PID (its session's ID too).
    assert before[:5] + before[7:] == after[:5] + after[7:]


def test_with_more_than_one_thread_the_command_joins_its_cgroup_instead(
    cgroup: Path, tmp_path: Path, popen_calls: list[bool]
) -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        lines = report(cgroup, tmp_path)
    finally:
        stop.set()
        other.join()
    assert popen_calls == [True], "a fork of a process with threads runs no Python"
    assert lines[0] == f"0::/{cgroup.relative_to(V2)}"


def test_nothing_to_do_is_a_plain_popen(tmp_path: Path, popen_calls: list[bool]) -> None:
    code, out, _ = run(spawn(["echo", "hi"], cwd=tmp_path, env={"PATH": PATH}, steps=ChildSteps()))
    assert (code, out) == (0, "hi\n")
    assert popen_calls == [False], "no pre-exec step: CPython vforks"


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory the job user can reach (the test's own is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="oz0-test-spawn-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def error_of(argv: list[str], cwd: Path, env: dict[str, str], steps: ChildSteps) -> str:
    try:
        command = spawn(argv, cwd=cwd, env=env, steps=steps)
    except (OSError, subprocess.SubprocessError) as e:
        return type(e).__name__
    return f"exit {run(command)[0]}"


@pytest.mark.one_thread  # clone3's child runs Python: fixtures/one_thread.py
def test_errors_are_those_popen_gives(
    cgroup: Path, shared_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    not_runnable = shared_dir / "not-runnable"
    not_runnable.write_text("#!/bin/sh\necho ran\n")
    not_runnable.chmod(0o644)
    private = Path(tempfile.gettempdir()) / f"oz0-test-spawn-private-{os.getpid()}"
    private.mkdir(mode=0o700)
    try:
        cases = [
            (["no-such-command-here"], {"PATH": f"{shared_dir}:{PATH}"}),
            (["no-such-command-here"], {"PATH": f"{private}:{PATH}"}),  # one it cannot enter
            ([str(shared_dir / "absent")], {"PATH": PATH}),
            (["not-runnable"], {"PATH": f"{shared_dir}:{PATH}"}),
            ([str(not_runnable)], {"PATH": PATH}),
            (["sh", "-c", "kill -9 $$"], {"PATH": PATH}),
        ]
        by_clone = [error_of(a, shared_dir, e, steps_for(cgroup)) for a, e in cases]
        monkeypatch.setattr(spawn_module._Clone3, "works", False)
        by_popen = [error_of(a, shared_dir, e, steps_for(cgroup)) for a, e in cases]
    finally:
        private.rmdir()
    assert by_clone == by_popen == [
        "FileNotFoundError", "PermissionError", "FileNotFoundError", "PermissionError",
        "PermissionError", "exit -9",
    ]  # fmt: skip
    monkeypatch.setattr(spawn_module._Clone3, "works", True)
    failing = ChildSteps(cgroup=cgroup, rlimits=((999, 1),))
    with pytest.raises(subprocess.SubprocessError, match="a step before its exec failed"):
        spawn(["true"], cwd=shared_dir, env={"PATH": PATH}, steps=failing)
    assert not (cgroup / "cgroup.procs").read_text().split(), "none left over"


@pytest.mark.one_thread  # clone3's child runs Python: fixtures/one_thread.py
@pytest.mark.parametrize("clone3", [True, False], ids=["clone3", "pre-exec"])
def test_a_session_s_terminal_is_its_controlling_terminal_on_either_path(
    cgroup: Path,
    tmp_path: Path,
    popen_calls: list[bool],
    monkeypatch: pytest.MonkeyPatch,
    clone3: bool,
) -> None:
    """A session's command (session_process.py) is given a PTY's side for its stdin,
    stdout and stderr (STDIO), which becomes its controlling terminal (TTY): else no
    Ctrl-C, no job control."""
    monkeypatch.setattr(spawn_module._Clone3, "works", clone3)
    tmp_path.chmod(0o755)
    master, slave = os.openpty()
    try:
        assert JOB_USER is not None
        os.fchown(slave, JOB_USER.uid, JOB_USER.gid)
        command = spawn(
            ["sh", "-c", "test -t 0 && echo tty; echo tty_nr=$(cut -d' ' -f7 /proc/self/stat)"],
            cwd=tmp_path,
            env={"PATH": PATH},
            steps=steps_for(cgroup),
            stdio=(slave, slave, slave),
            tty=True,
        )
    finally:
        os.close(slave)
    assert command.stdout is None and command.stderr is None
    assert popen_calls == ([] if clone3 else [True])
    seen = b""
    deadline = time.monotonic() + 10
    while b"tty_nr=" not in seen or not seen.endswith(b"\n"):
        assert time.monotonic() < deadline, seen
        try:
            seen += os.read(master, 1024)
        except OSError:  # EIO: it has exited, its output read
            break
    os.close(master)
    while command.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    lines = seen.decode().split()
    assert lines[0] == "tty"
    assert lines[1] != "tty_nr=0", "the terminal is its controlling terminal"
