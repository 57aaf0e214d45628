"""The per-attempt supervisor (oz0_node/jobs/supervisor.py, the agent's handle on it
supervisor_client.py, and the files they share attempt_files.py): real supervisors running
real commands as the job user, in real cgroups (this machine's v2 hierarchy at
/sys/fs/cgroup/unified) or followed as their subreaper; the "agent" that launches them is
this test process, or a child Python process that is then killed. Starts no server and
binds no address."""

from __future__ import annotations

import ctypes
import json
import os
import signal
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.attempt_processes import all_gone, forked_by_launcher, gone, isolation_for, own_uid
from fixtures.polling import wait_until
from oz0_common.attempt_messages import AttemptResult, EndedBecause
from oz0_node.jobs import attempt_files, procfs, uid_sweep
from oz0_node.jobs import launcher as launcher_module
from oz0_node.jobs.attempt_files import (
    OUTPUT_CAP,
    PID_FILE,
    RECORD_DATA,
    TRACKING_FILE,
    AttemptStatus,
    OutputRecord,
    SupervisedSpec,
    attempts_root,
)
from oz0_node.jobs.attempt_uids import CLAIMS_DIR, DEFAULT_RANGE, UidClaims, UidRange
from oz0_node.jobs.isolation import Limits
from oz0_node.jobs.launcher import Launcher
from oz0_node.jobs.process import KILL_GRACE
from oz0_node.jobs.supervisor_client import Supervised, find_all, launch, stop_all
from oz0_node.jobs.tracking import CGROUP_V2, SCAN_EVERY, SUBREAPER

NODE_ID = "node-5c0e0000beef"
JOB = "job-00000000cafe"
V2 = Path("/sys/fs/cgroup/unified")
TRACKINGS = [CGROUP_V2, SUBREAPER]
ENDS_WITHIN = 15.0
REPO = Path(__file__).parents[1]
# Left behind three ways: a new session, a double fork, nohup in a grandchild.
LEAVE_BEHIND = (
    "setsid sleep 600 & echo $!; (sleep 600 & echo $!); "
    "sh -c 'nohup sleep 600 >/dev/null 2>&1 & echo $!'"
)
PR_GET_CHILD_SUBREAPER = 37


def spec_of(
    *command: str,
    attempt: int = 1,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
    limits: Limits | None = None,
) -> SupervisedSpec:
    return SupervisedSpec(
        node_id=NODE_ID,
        job_id=JOB,
        attempt=attempt,
        command=command,
        env=env or {},
        timeout=timeout,
        limits=limits or Limits(),
    )


def wait_status(supervised: Supervised, within: float = ENDS_WITHIN) -> AttemptResult:
    status = wait_until(supervised.status, within, f"{supervised.dir.name}: a status", step=0.05)
    wait_until(lambda: not supervised.alive(), 5.0, "it runs on after its status", step=0.05)
    return status.result


def all_output(supervised: Supervised) -> list[OutputRecord]:
    records, _ = supervised.read_output(0, 4 * OUTPUT_CAP)
    return records


def text(supervised: Supervised, stream: str = "stdout") -> str:
    return b"".join(r.data for r in all_output(supervised) if r.stream == stream).decode()


def output_lines(supervised: Supervised, count: int, within: float = 10.0) -> list[str]:
    """The first COUNT lines of its stdout, once they are there."""
    wait_until(
        lambda: len(text(supervised).splitlines()) >= count, within, f"{count} lines",
        step=0.05, detail=lambda: text(supervised),
    )  # fmt: skip
    return text(supervised).splitlines()[:count]


def no_cgroup_left() -> bool:
    return not (V2 / f"oz0-node-{NODE_ID}").exists()


def supervisor_pid(supervised: Supervised) -> int:
    return int(json.loads((supervised.dir / PID_FILE).read_text())["pid"])


@pytest.fixture
def data_dir(tmp_path: Path) -> Iterator[Path]:
    """The node's data directory; whatever a failing test left running is stopped."""
    yield tmp_path
    stop_all(tmp_path, 5.0)


# --- output and status ----------------------------------------------------------------------


def test_both_streams_in_their_order_and_the_exit_status_come_out_of_the_attempts_directory(
    data_dir: Path,
) -> None:
    script = "echo one; sleep 0.2; echo two >&2; sleep 0.2; echo three; ulimit -n; exit 3"
    limits = Limits(memory=256 << 20, max_open_files=64)
    supervised = launch(
        data_dir,
        spec_of("sh", "-c", script, limits=limits),
        isolation_for(data_dir, CGROUP_V2, supervised=True),
    )
    assert supervised.dir == attempts_root(data_dir) / f"{JOB}-1"
    assert (supervised.job_id, supervised.attempt) == (JOB, 1)
    wait_status(supervised)
    written = json.loads((supervised.dir / "status.json").read_bytes())
    uid = own_uid(written["applied"])
    assert written == {
        "version": 2,
        "exit_code": 3,
        "signal": None,
        "ended_because": "exit",
        "output_bytes": len("one\ntwo\nthree\n64\n"),
        "truncated": False,
        "applied": {
            "user": f"uid {uid} (its own)",
            "tracking": CGROUP_V2,
            "limits": {"memory": "cgroup v1", "max_open_files": "rlimit"},
            "private_tmp": "mount namespace",
            "swept": "nothing left",
        },
        # The supervisor's own word; the agent says whether it lost output of it.
        "output_complete": True,
    }
    assert supervised.status() == AttemptStatus(AttemptResult(
        3, None, EndedBecause.EXIT, len("one\ntwo\nthree\n64\n"), False, written["applied"]
    ))  # fmt: skip
    records = all_output(supervised)
    assert [(r.stream, r.data) for r in records] == [
        ("stdout", b"one\n"),
        ("stderr", b"two\n"),
        ("stdout", b"three\n64\n"),
    ] or [(r.stream, r.data) for r in records] == [
        ("stdout", b"one\n"),
        ("stderr", b"two\n"),
        ("stdout", b"three\n"),
        ("stdout", b"64\n"),
    ]
    # Read a record at a time: each call goes on where the last one stopped.
    offset, paged = 0, []
    while True:
        got, offset = supervised.read_output(offset, 1)
        if not got:
            break
        assert len(got) == 1, "one record at least, then no more than the limit"
        paged += got
    assert paged == records
    assert (supervised.dir / "output").stat().st_size == offset
    assert not supervised.alive()
    assert (supervised.dir / "status.json").stat().st_mode & 0o777 == 0o600
    assert attempts_root(data_dir).stat().st_mode & 0o777 == 0o700
    supervised.remove()
    assert not supervised.dir.exists() and find_all(data_dir) == []


def test_a_command_that_cannot_start_has_a_status_and_a_line_on_stderr(data_dir: Path) -> None:
    supervised = launch(
        data_dir, spec_of("/no/such/program"), isolation_for(data_dir, CGROUP_V2, supervised=True)
    )
    status = wait_status(supervised)
    assert status.exit_code == 127 and status.ended_because == "exit"
    assert text(supervised, "stderr").startswith("oz0-node: cannot run '/no/such/program'")
    assert no_cgroup_left()


def test_output_past_the_cap_is_marked_once_then_dropped_and_the_command_does_not_block(
    data_dir: Path,
) -> None:
    command = f"head -c {3 * OUTPUT_CAP} /dev/zero; echo done >&2"
    supervised = launch(
        data_dir, spec_of("sh", "-c", command), isolation_for(data_dir, CGROUP_V2, supervised=True)
    )
    status = wait_status(supervised)
    assert status.exit_code == 0, text(supervised, "stderr")
    assert status.output_bytes == OUTPUT_CAP and status.truncated is True
    records = all_output(supervised)
    assert all(len(r.data) <= RECORD_DATA for r in records)
    assert sum(len(r.data) for r in records) == OUTPUT_CAP
    assert records[-1] == OutputRecord("stdout", b"", truncated=True)
    assert [r for r in records if r.truncated] == [records[-1]], "one mark, nothing after it"
    # The file's bound (the module's docstring): the data, and 5 bytes a record.
    size = (supervised.dir / "output").stat().st_size
    assert size == OUTPUT_CAP + 5 * len(records) <= 6 * OUTPUT_CAP


def test_the_supervisor_imports_no_event_loop_and_keeps_the_agents_bounds() -> None:
    # Its start-up is part of every dispatch: asyncio, trio and temporalio stay out.
    loaded = subprocess.run(
        [sys.executable, "-P", "-c",
         "import sys, oz0_node.jobs.supervisor; "
         "print(sorted(m for m in ('asyncio', 'trio', 'temporalio') if m in sys.modules))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert loaded.stdout.strip() == "[]"


def test_a_record_half_written_at_the_end_is_not_returned_until_it_is_whole(
    tmp_path: Path,
) -> None:
    directory = attempts_root(tmp_path) / f"{JOB}-1"
    directory.mkdir(parents=True)
    whole = struct.pack(">BI", 1, 3) + b"abc" + struct.pack(">BI", 2, 2) + b"de"
    half = struct.pack(">BI", 1, 5) + b"fg"
    (directory / "output").write_bytes(whole + half)
    supervised = find_all(tmp_path)[0]
    assert supervised == Supervised(JOB, 1, directory)
    records, offset = supervised.read_output(0, 1 << 20)
    assert records == [OutputRecord("stdout", b"abc"), OutputRecord("stderr", b"de")]
    assert offset == len(whole)
    assert supervised.read_output(offset, 1 << 20) == ([], offset)
    with (directory / "output").open("ab") as f:
        f.write(b"hij")
    assert supervised.read_output(offset, 1 << 20) == (
        [OutputRecord("stdout", b"fghij")],
        len(whole) + 10,
    )
    assert not supervised.alive() and supervised.status() is None


# --- the agent's death ----------------------------------------------------------------------

# An agent: launches one attempt (through its launcher, or as a fresh interpreter), says
# where and its launcher's PID, then waits to be killed.
AGENT = """
import sys, time
from pathlib import Path
from oz0_node.jobs.isolation import Isolation, Limits
from oz0_node.jobs.launcher import Launcher
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.supervisor_client import launch

data = Path(sys.argv[1])
isolation = Isolation.detect(data, tracking=sys.argv[2], supervised=True)
launcher = Launcher() if sys.argv[3] == "launcher" else None
if launcher is not None:
    launcher.start()
spec = SupervisedSpec(sys.argv[4], sys.argv[5], 1, tuple(sys.argv[6:]), {"SECRET": "s3cr3t-9f"},
                      None, Limits())
print(launch(data, spec, isolation, launcher).dir, flush=True)
print(launcher.pid if launcher is not None else 0, flush=True)
time.sleep(600)
"""

# Prints its PID, then (once the test says so, by removing a file) its last line.
WAITS_THEN_ENDS = 'echo $$; while [ -e "$1" ]; do sleep 0.05; done; echo last; exit 7'


@pytest.mark.parametrize("how", ["launcher", "interpreter"])
@pytest.mark.parametrize("kill", ["agent", "process group"])
def test_the_agents_death_does_not_touch_the_command_which_ends_and_leaves_its_status(
    kill: str, how: str, data_dir: Path, pids: list[int]
) -> None:
    # Where the job can see it: not below pytest's 0700 directories, nor in /tmp (its own).
    flag = Path(f"/dev/shm/oz0-supervisor-test-{os.getpid()}")
    flag.write_text("")
    flag.chmod(0o644)
    agent = subprocess.Popen(
        [sys.executable, "-c", AGENT, str(data_dir), CGROUP_V2, how, NODE_ID, JOB,
         "sh", "-c", WAITS_THEN_ENDS, "sh", str(flag)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    try:
        assert agent.stdout is not None
        supervised = Supervised(JOB, 1, Path(agent.stdout.readline().strip()))
        launcher = int(agent.stdout.readline())
        (command,) = [int(n) for n in output_lines(supervised, 1)]
        pids.append(command)
        supervisor = supervisor_pid(supervised)
        # Forked by the launcher (its command line), or a fresh interpreter.
        assert forked_by_launcher(supervisor) == (how == "launcher")
        # The job's environment reached the command, and nowhere else on disk or in argv.
        for path in supervised.dir.iterdir():
            assert b"s3cr3t-9f" not in path.read_bytes(), path.name
        for pid in (supervisor, launcher) if launcher else (supervisor,):
            for name in ("cmdline", "environ"):
                assert b"s3cr3t-9f" not in Path(f"/proc/{pid}/{name}").read_bytes()
        assert b"SECRET=s3cr3t-9f" in Path(f"/proc/{command}/environ").read_bytes()
        if kill == "agent":
            agent.kill()
        else:
            os.killpg(agent.pid, signal.SIGKILL)
        agent.wait()
    finally:
        agent.kill()
        agent.wait()
        if agent.stdout is not None:
            agent.stdout.close()
    time.sleep(0.3)
    assert not gone(command), "the agent's death ended the command"
    assert supervised.alive() and supervised.status() is None
    # The launcher goes with its agent (a new agent starts its own), the attempt stays.
    if launcher:
        wait_until(lambda: gone(launcher), 5.0, "the launcher outlived it", step=0.05)
    # A new agent (another process) finds it.
    found = subprocess.run(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; "
         "from oz0_node.jobs.supervisor_client import find_all; "
         "print([(s.job_id, s.attempt, s.alive()) for s in find_all(Path(sys.argv[1]))])",
         str(data_dir)],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert found.stdout.strip() == f"[('{JOB}', 1, True)]"
    # Its own UID stays its own through the agent's death: claimed, and held by the
    # supervisor (no one may sweep it or take it meanwhile).
    running = uid_sweep.read_status(command)
    assert running is not None
    uid = running.uids[0]
    assert uid in DEFAULT_RANGE and (CLAIMS_DIR / str(uid)).is_file()
    assert UidClaims().reclaim(uid, uid_sweep.sweep) is None, "swept while its attempt runs"
    flag.unlink()
    status = wait_status(supervised)
    assert (status.exit_code, status.ended_because) == (7, "exit")
    assert text(supervised) == f"{command}\nlast\n"
    assert gone(command) and no_cgroup_left()
    assert not (CLAIMS_DIR / str(uid)).exists(), "given up once swept"


# --- stop, timeout, what a command leaves -------------------------------------------------------

# Says SIGTERM came, and runs on: only SIGKILL ends it (after the grace).
IGNORES_TERM = "trap 'echo term' TERM; echo $$ $PWD; sleep 600 & wait; sleep 600 & wait"


def test_stop_sends_sigterm_then_kills_after_the_grace_and_leaves_nothing(
    data_dir: Path, pids: list[int]
) -> None:
    supervised = launch(
        data_dir,
        spec_of("sh", "-c", IGNORES_TERM),
        isolation_for(data_dir, CGROUP_V2, supervised=True),
    )
    shell, workdir = output_lines(supervised, 1)[0].split()
    pids.append(int(shell))
    cgroup = V2 / f"oz0-node-{NODE_ID}" / f"{JOB}-1"
    assert cgroup.is_dir() and Path(workdir).is_dir()
    started = time.monotonic()
    supervised.stop()
    status = wait_status(supervised)
    assert time.monotonic() - started >= KILL_GRACE - 0.5, "killed before its grace"
    assert status.ended_because == "stopped"
    assert (status.exit_code, status.signal) == (None, signal.SIGKILL)
    assert "term" in text(supervised).splitlines()
    assert gone(int(shell)) and not cgroup.exists() and no_cgroup_left()
    assert not Path(workdir).exists()
    supervised.stop()  # an ended supervisor: nothing to signal, nothing raised


def test_stop_works_for_a_supervisor_launched_from_a_thread_that_blocks_sigterm(
    data_dir: Path,
) -> None:
    launched: list[Supervised] = []

    def launch_blocked() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGTERM])
        launched.append(
            launch(
                data_dir,
                spec_of("sleep", "600"),
                isolation_for(data_dir, CGROUP_V2, supervised=True),
            )
        )

    thread = threading.Thread(target=launch_blocked)
    thread.start()
    thread.join()
    (supervised,) = launched
    supervised.stop()
    status = wait_status(supervised, 5.0)
    assert (status.ended_because, status.signal) == ("stopped", signal.SIGTERM)


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_the_command_ignores_no_signal_the_agent_was_started_ignoring(
    data_dir: Path, tracking: str
) -> None:
    # A shell's `&` ignores SIGINT and SIGQUIT, nohup SIGHUP; a supervisor inherits them
    # (here from the test). Each way of starting the command (clone3 into its cgroup, or
    # Popen under the subreaper) must start it with none of them ignored.
    inherited = (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)
    before = [signal.signal(sig, signal.SIG_IGN) for sig in inherited]
    try:
        supervised = launch(
            data_dir,
            spec_of("grep", "^SigIgn", "/proc/self/status"),
            isolation_for(data_dir, tracking, supervised=True),
        )
    finally:
        for sig, handler in zip(inherited, before, strict=True):
            signal.signal(sig, handler)
    assert wait_status(supervised).exit_code == 0
    out = b"".join(r.data for r in all_output(supervised) if r.stream == "stdout")
    assert out.split() == [b"SigIgn:", b"0" * 16]


def test_a_timeout_ends_the_command_and_says_so(data_dir: Path) -> None:
    supervised = launch(
        data_dir,
        spec_of("sleep", "600", timeout=0.5),
        isolation_for(data_dir, CGROUP_V2, supervised=True),
    )
    status = wait_status(supervised)
    assert status.ended_because == "timeout"
    assert (status.exit_code, status.signal) == (None, signal.SIGTERM)


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_what_a_command_left_double_forked_or_setsid_ends_with_its_attempt(
    tracking: str, data_dir: Path, pids: list[int]
) -> None:
    supervised = launch(
        data_dir,
        spec_of("sh", "-c", LEAVE_BEHIND),
        isolation_for(data_dir, tracking, supervised=True),
    )
    status = wait_status(supervised)
    assert status.exit_code == 0, text(supervised, "stderr")
    assert status.applied == {
        "user": f"uid {own_uid(status.applied)} (its own)",
        "tracking": tracking,
        "limits": {},
        "private_tmp": "mount namespace",
        "swept": "nothing left",
    }
    left = [int(n) for n in text(supervised).split()]
    pids.extend(left)
    assert len(left) == 3
    assert all(gone(pid) for pid in left), f"{tracking}: still running after its status"
    assert no_cgroup_left()
    # The supervisor is their subreaper, not the agent (this process).
    libc = ctypes.CDLL(None, use_errno=True)
    flag = ctypes.c_int(-1)
    assert libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    assert flag.value == 0, "detect(supervised=True) made the agent a subreaper"


def test_what_escaped_subreaper_tracking_is_ended_by_the_sweep_of_its_own_uid(
    data_dir: Path, pids: list[int]
) -> None:
    """A process of the attempt's UID that its tracking never saw is ended by the sweep of
    that UID over /proc, and `applied` says so. It is started here, outside the attempt's
    tree and without its OZ0_ names, while the attempt waits: an orphan made inside the
    tree (`env -i setsid … &`) is seen by a scan that comes before its parent exits, which a
    loaded machine makes likely, so it could not show the sweep."""
    go = Path(f"/dev/shm/oz0-test-escape-{os.getpid()}")
    waits = f"id -u; while [ ! -e {go} ]; do sleep 0.05; done"
    supervised = launch(
        data_dir, spec_of("sh", "-c", waits), isolation_for(data_dir, SUBREAPER, supervised=True)
    )
    try:
        (uid,) = [int(n) for n in output_lines(supervised, 1)]
        escaped = subprocess.Popen(
            ["sleep", "600"],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            start_new_session=True,
            stdin=subprocess.DEVNULL,
        )
        pids.append(escaped.pid)
        go.touch(mode=0o644)
        status = wait_status(supervised)
        assert status.exit_code == 0, text(supervised, "stderr")
        assert gone(escaped.pid), "it outlived its attempt"
        assert escaped.wait(5.0) == -signal.SIGKILL
        assert status.applied is not None and status.applied["swept"] == "ended 1 process"
    finally:
        go.unlink(missing_ok=True)


# --- the supervisor's own death, and a purge ------------------------------------------------------


@pytest.mark.parametrize("tracking", TRACKINGS)
def test_a_killed_supervisors_leftovers_are_ended_and_its_directory_emptied(
    tracking: str, data_dir: Path, pids: list[int]
) -> None:
    # Claims of its own, on UIDs no agent uses: once the supervisor is dead its claim is
    # stale, and an agent starting meanwhile (another file's, side by side) sweeps the
    # machine's stale claims, which would end its leftovers before the test looked.
    isolation = isolation_for(data_dir, tracking, supervised=True)
    isolation.uids = claims = UidClaims(UidRange(60900, 60999), data_dir / "uid-claims")
    supervised = launch(
        data_dir,
        spec_of("sh", "-c", f"{LEAVE_BEHIND}; echo $$ $PWD $(id -u); sleep 600"),
        isolation,
    )
    *left, shell_and_dir = output_lines(supervised, 4)
    shell, workdir, uid = shell_and_dir.split()
    claim = claims.path(int(uid))
    assert claim.is_file(), "its own UID is claimed while it runs"
    numbers = [int(n) for n in left] + [int(shell)]
    pids.extend(numbers)
    time.sleep(2 * SCAN_EVERY + 0.2)  # a subreaper records what it found at its last look
    os.kill(supervisor_pid(supervised), signal.SIGKILL)
    wait_until(lambda: not supervised.alive(), 5.0, "the supervisor ends", step=0.05)
    assert supervised.status() is None
    assert not any(gone(pid) for pid in numbers), "its death ended them"
    supervised.end_leftovers()
    all_gone(numbers, 5.0, f"{tracking}: what it left still runs")
    assert not Path(workdir).exists() and no_cgroup_left()
    assert not (supervised.dir / TRACKING_FILE).exists()

    # Its UID (recorded in tracking.json) swept and given up: nothing of it is left.
    assert not claim.exists() or claims.reclaim(int(uid), uid_sweep.sweep) is not None
    assert not claim.exists(), "its UID's claim was kept"
    assert all(p.zombie for p in uid_sweep.processes(lambda u: u == int(uid)))
    supervised.remove()
    assert find_all(data_dir) == []


def test_end_leftovers_never_touches_a_process_that_reused_a_recorded_pid(
    tmp_path: Path, pids: list[int]
) -> None:
    other = subprocess.Popen(["sleep", "600"])
    pids.append(other.pid)
    stat = procfs.read_stat(other.pid)
    assert stat is not None
    directory = attempts_root(tmp_path) / f"{JOB}-1"
    directory.mkdir(parents=True)
    record = {"workdir": "", "cgroups": [], "pids": [[other.pid, stat.start_time - 1]]}
    (directory / TRACKING_FILE).write_text(json.dumps({"attempts": {f"{JOB}-1": record}}))
    Supervised(JOB, 1, directory).end_leftovers()
    time.sleep(0.2)
    assert other.poll() is None, "a process that reused the PID was killed"
    other.kill()
    other.wait()


def test_stop_all_leaves_no_directory_process_or_cgroup(data_dir: Path, pids: list[int]) -> None:
    running = [
        launch(
            data_dir,
            spec_of("sh", "-c", IGNORES_TERM, attempt=n),
            isolation_for(data_dir, t, supervised=True),
        )
        for n, t in ((1, CGROUP_V2), (2, SUBREAPER), (3, CGROUP_V2))
    ]
    ended = launch(
        data_dir, spec_of("true", attempt=4), isolation_for(data_dir, CGROUP_V2, supervised=True)
    )
    wait_status(ended)
    numbers = [int(output_lines(s, 1)[0].split()[0]) for s in running]
    pids.extend(numbers)
    killed = running[2]
    time.sleep(2 * SCAN_EVERY + 0.2)
    os.kill(supervisor_pid(killed), signal.SIGKILL)
    wait_until(lambda: not killed.alive(), 5.0, "the killed supervisor ends", step=0.05)
    assert stop_all(data_dir, KILL_GRACE + 5.0) == 4
    all_gone(numbers, 1.0, "what it left ends")
    assert list(attempts_root(data_dir).iterdir()) == []
    assert no_cgroup_left()
    assert not list(Path("/tmp").glob(f"oz0-job-{JOB}-*"))


# --- the launcher -------------------------------------------------------------------------------

# Says it ran, then waits to be stopped (a short command's supervisor would be gone before
# its command line could be read).
RUNS_ON = "echo ran; exec sleep 600"


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    started = Launcher()
    started.start()
    yield started
    started.stop()


def test_launches_go_on_when_the_launcher_dies_and_a_new_one_takes_over(
    launcher: Launcher, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolation = isolation_for(data_dir, CGROUP_V2, supervised=True)
    first = launch(data_dir, spec_of("sh", "-c", RUNS_ON, attempt=1), isolation, launcher)
    assert output_lines(first, 1) == ["ran"] and forked_by_launcher(supervisor_pid(first))
    dead = launcher.pid
    assert dead is not None
    os.kill(dead, signal.SIGKILL)
    wait_until(lambda: gone(dead), 5.0, "the dead one gone", step=0.05)
    # Within RESTART_AFTER of its start: a fresh interpreter, as without a launcher.
    second = launch(data_dir, spec_of("sh", "-c", RUNS_ON, attempt=2), isolation, launcher)
    assert output_lines(second, 1) == ["ran"] and not forked_by_launcher(supervisor_pid(second))
    assert launcher.pid is None
    # Later, a new launcher.
    monkeypatch.setattr(launcher_module, "RESTART_AFTER", 0.0)
    third = launch(data_dir, spec_of("sh", "-c", RUNS_ON, attempt=3), isolation, launcher)
    assert output_lines(third, 1) == ["ran"] and forked_by_launcher(supervisor_pid(third))
    assert launcher.pid not in (None, dead)


def test_a_launcher_that_does_not_fork_in_time_is_replaced_and_the_attempt_runs_once(
    launcher: Launcher, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launcher_module, "FORK_WITHIN", 0.5)
    stuck = launcher.pid
    assert stuck is not None
    os.kill(stuck, signal.SIGSTOP)  # takes the descriptors (its socket's buffer), forks nothing
    supervised = launch(
        data_dir,
        spec_of("sh", "-c", RUNS_ON),
        isolation_for(data_dir, CGROUP_V2, supervised=True),
        launcher,
    )
    assert not forked_by_launcher(supervisor_pid(supervised))
    assert launcher.pid is None, "not replaced"
    wait_until(lambda: gone(stuck), 5.0, "the stuck launcher gone", step=0.05)
    time.sleep(0.5)
    assert text(supervised) == "ran\n", "run once"


@pytest.mark.parametrize("gave_up", ["ready pipe closed", "no attempt handed"])
def test_a_first_process_forked_after_launch_gave_up_starts_nothing(
    gave_up: str, launcher: Launcher, data_dir: Path
) -> None:
    directory = attempts_root(data_dir) / f"{JOB}-1"
    directory.mkdir(parents=True)
    lock = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    logs = os.open(directory / "supervisor.log", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
    attempt_r, attempt_w = os.pipe2(os.O_CLOEXEC)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    isolation = isolation_for(data_dir, CGROUP_V2, supervised=True)
    handover = attempt_files.handover(spec_of("sh", "-c", RUNS_ON), isolation, directory, lock)
    if gave_up == "ready pipe closed":
        os.close(ready_r)
        # Even with the attempt in its pipe, a child that could not say FORKED starts nothing.
        os.write(attempt_w, handover)
    os.close(attempt_w)
    try:
        assert launcher.send((attempt_r, ready_w, logs, lock))
    finally:
        for fd in (attempt_r, ready_w, logs, lock):
            os.close(fd)
    if gave_up == "no attempt handed":
        with os.fdopen(ready_r, "rb") as ready:
            assert ready.read() == launcher_module.FORKED, "forked, then exited"
    time.sleep(0.5)
    supervised = Supervised(JOB, 1, directory)
    assert not supervised.alive()
    assert sorted(p.name for p in directory.iterdir()) == ["lock", "supervisor.log"]
    assert (directory / "supervisor.log").read_text() == ""
    assert not list(Path("/tmp").glob(f"oz0-job-{JOB}-*")) and no_cgroup_left()
