"""Each attempt a UID of its own, with a real server, real Temporal and real agents as root
(127.0.0.65): two jobs at once on one node cannot reach each other (environment,
directory, signals) nor leave work to the machine's daemons (crontab, at), and nothing of
either UID is left after; the join line as `token create` prints it, pasted as root on a
machine with no `oz0-job` user, joins and runs a job (docs/manage-nodes.md, "What a job can
reach")."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from fixtures.agent import AgentProcess
from fixtures.cluster import REPO, ClusterFiles, StartServer
from fixtures.job_calls import api
from oz0_node.jobs import uid_sweep
from oz0_node.jobs.attempt_uids import CLAIMS_DIR, DEFAULT_RANGE
from tests.conftest import CliRunner

DEFAULT_RANGE_UIDS = range(DEFAULT_RANGE.first, DEFAULT_RANGE.last + 1)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (agents giving UIDs)"),
]

SERVER = "127.0.0.65"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
SECRET = "s3cr3t-of-job-a-41d7"
# Where the machine's daemons keep what `crontab` and `at` were given.
SPOOLS = (Path("/var/spool/cron/crontabs"), Path("/var/spool/cron/atjobs"))


def first_line(files: ClusterFiles, job_id: str, timeout: float = 60) -> str:
    """The first line the job's attempt 1 printed, once it has."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = api(files).get(f"/api/v1/jobs/{job_id}/output")
        text = b"".join(base64.b64decode(c["data"]) for c in page["chunks"] if c["attempt"] == 1)
        if b"\n" in text:
            return text.split(b"\n")[0].decode()
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} printed no line in {timeout} s")


def output(files: ClusterFiles, job_id: str) -> tuple[str, str]:
    """Attempt 1's stdout and stderr, as kept by the cluster."""
    page = api(files).get(f"/api/v1/jobs/{job_id}/output")
    streams = {"stdout": b"", "stderr": b""}
    for chunk in page["chunks"]:
        if chunk["attempt"] == 1:
            streams[chunk["stream"]] += base64.b64decode(chunk["data"])
    return streams["stdout"].decode(), streams["stderr"].decode()


def wait_ended(files: ClusterFiles, job_id: str, timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job: dict[str, Any] = api(files).get(f"/api/v1/jobs/{job_id}")
        if job["ended_at"] is not None:
            return job
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} did not end in {timeout} s")


def left_of(uid: int) -> list[str]:
    """What is left on the machine of UID: live processes, System V IPC objects, files in
    the shared places and the cron and at spools, its claim."""
    left = [f"process {p.pid}" for p in uid_sweep.processes(lambda u: u == uid) if not p.zombie]
    left += [f"{o.kind} {o.id}" for o in uid_sweep.ipc_objects(lambda u: u == uid)]
    for place in (*uid_sweep.SHARED_PLACES, *SPOOLS):
        owned = uid_sweep.first_owned(place, lambda u: u == uid)
        if owned is not None:
            left.append(str(owned[0]))
    if (CLAIMS_DIR / str(uid)).exists():
        left.append("its claim")
    return left


# The second job's tries, each as a job would, one line each: what it could do.
PROBE = textwrap.dedent("""\
    a_pid=$1 a_dir=$2
    echo "me $(id -u) $(id -g) $(id -G)"
    if tr '\\0' '\\n' < /proc/$a_pid/environ 2>/dev/null | grep -q A_SECRET; then
        echo "environ: read"; else echo "environ: refused"; fi
    if ls "$a_dir" >/dev/null 2>&1; then echo "dir: listed"; else echo "dir: refused"; fi
    if cd "$a_dir" 2>/dev/null; then echo "cd: entered"; cd "$HOME"; else echo "cd: refused"; fi
    if kill -0 "$a_pid" 2>/dev/null; then echo "signal: sent"; else echo "signal: refused"; fi
    if echo '* * * * * touch /dev/shm/cron-ran' | crontab -; then
        echo "crontab: installed"; else echo "crontab: refused"; fi
    if echo 'touch /dev/shm/at-ran' | at now + 1 minute; then
        echo "at: queued"; else echo "at: refused"; fi
    # What it leaves: a daemon, a System V segment, a file in /dev/shm and in its /tmp.
    setsid sleep 600 </dev/null >/dev/null 2>&1 &
    ipcmk -M 4096 >/dev/null
    echo x > /dev/shm/oz0-e2e-left-$$
    echo x > /tmp/oz0-e2e-left-$$
    echo x > /var/tmp/oz0-e2e-left-$$
    echo "tmp: $(ls -A /tmp | wc -l)"
""")


def joined_agent(cli: CliRunner, files: ClusterFiles, tmp_path: Path) -> AgentProcess:
    token = cli("token", "create", "--tenant", "default", "--json", env=files.cli_env)
    assert token.code == 0, token.err
    agent = AgentProcess.joining(
        tmp_path / "node", [f"{SERVER}:7443"], files.ca_hash, token=token.json()["token"]
    ).start()
    agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    return agent


def test_two_jobs_at_once_on_one_node_cannot_reach_each_other_and_leave_nothing(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    # Without them the probe's tries fail for another reason ("not found") and prove nothing.
    missing = [tool for tool in ("crontab", "at") if shutil.which(tool) is None]
    assert not missing, f"{', '.join(missing)} missing: install Debian's cron and at (.ci/run does)"
    start_server(cluster_files, SERVER)
    env = cluster_files.cli_env
    agents.append(joined_agent(cli, cluster_files, tmp_path))
    first = cli(
        "job", "run", "--secret-env", "A_SECRET", "--detach", "--json", "--",
        "sh", "-c", 'echo "$$ $(id -u) $PWD"; exec sleep 600',
        env={**env, "A_SECRET": SECRET},
    )  # fmt: skip
    assert first.code == 0, first.err
    a_job = first.json()["id"]
    a_pid, a_uid, a_dir = first_line(cluster_files, a_job).split()
    assert SECRET.encode() in Path(f"/proc/{a_pid}/environ").read_bytes()
    second = cli(
        "job", "run", "--detach", "--json", "--", "sh", "-c", PROBE, "probe", a_pid, a_dir,
        env=env,
    )  # fmt: skip
    assert second.code == 0, second.err
    b_job = second.json()["id"]
    ended = wait_ended(cluster_files, b_job)
    out, err = output(cluster_files, b_job)
    assert ended["exit_code"] == 0, err
    me, *tried = out.splitlines()
    b_uid = int(me.split()[1])
    assert me == f"me {b_uid} {b_uid} {b_uid}", "its own UID, its own group, no other"
    assert int(a_uid) != b_uid and {int(a_uid), b_uid} <= set(DEFAULT_RANGE_UIDS)
    assert tried == [
        "environ: refused",
        "dir: refused",
        "cd: refused",
        "signal: refused",
        "crontab: refused",
        "at: refused",
        "tmp: 2",  # its own /tmp: its working directory and the file it wrote, nothing else
    ], out
    assert "your UID isn't in the passwd file" in err, "crontab says why"
    assert "Cannot access user database" in err, "at says why"
    assert SECRET not in out + err

    [attempt] = cli("job", "show", b_job, "--json", env=env).json()["attempts"]
    assert attempt["applied"]["user"] == f"uid {b_uid} (its own)"
    assert attempt["applied"]["private_tmp"] == "mount namespace"
    # Its daemon went with its cgroup; the sweep found the segment and the /dev/shm file
    # (/tmp and /var/tmp were its own: gone with it).
    assert attempt["applied"]["swept"] == "removed 1 IPC object, removed 1 file"
    text = cli("job", "show", b_job, env=env).out
    assert (
        f"attempt 1: user uid {b_uid} (its own), tracked by cgroup v2, own /tmp and /var/tmp:"
        " mount namespace, swept: removed 1 IPC object, removed 1 file"
    ) in text, text

    assert cli("job", "cancel", a_job, env=env).code == 0
    wait_ended(cluster_files, a_job)
    for uid in (int(a_uid), b_uid):
        deadline = time.monotonic() + 10
        while left_of(uid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert left_of(uid) == [], f"uid {uid} left {left_of(uid)}"
    assert not Path(a_dir).exists()


def _without_oz0_job(source: Path, into: Path) -> Path:
    kept = [
        line
        for line in source.read_text().splitlines(keepends=True)
        if not line.startswith("oz0-job:")
    ]
    into.write_text("".join(kept))
    into.chmod(source.stat().st_mode & 0o777)
    return into


def test_the_pasted_join_line_as_root_with_no_oz0_job_user_joins_and_runs_a_job(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The machine has no `oz0-job`: the agent, its supervisors and its jobs run in a mount
    namespace where /etc/passwd, /etc/group and their shadows have no such line (the
    machine's own files stay as they are, for the other tests' agents). The server has no
    agent file to serve, so the line starts an installed `oz0-node` (this tree's)."""
    monkeypatch.setenv("OZ0_AGENT_FILE", str(tmp_path / "no-agent-file"))
    start_server(cluster_files, SERVER)
    env = cluster_files.cli_env
    created = cli("token", "create", "--tenant", "default", env=env)
    assert created.code == 0, created.err
    line = created.out.rstrip("\n").splitlines()[-1]
    assert line.startswith("OZ0_JOIN_TOKEN=") and " oz0-node start " in line, line

    machine = tmp_path / "machine"
    (machine / "bin").mkdir(parents=True)
    installed = machine / "bin" / "oz0-node"
    installed.write_text(
        f'#!/bin/sh\nPYTHONPATH={REPO} exec {sys.executable} -m oz0_node.main "$@"\n'
    )
    installed.chmod(0o755)
    files = machine / "etc"
    files.mkdir()
    mounts = " && ".join(
        f"mount --bind {_without_oz0_job(Path('/etc', name), files / name)} /etc/{name}"
        for name in ("passwd", "group", "shadow", "gshadow")
        if Path("/etc", name).exists()
    )
    data = machine / "data"
    shell = (
        f"{mounts} && exec env -i PATH={machine / 'bin'}:/usr/bin:/bin HOME={machine} "
        f"OZ0_NODE_DATA_DIR={data} sh"
    )
    log = tmp_path / "pasted.log"
    with log.open("w") as out:
        pasted = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", shell],
            stdin=subprocess.PIPE, stdout=out, stderr=out, text=True, cwd=machine,
        )  # fmt: skip
    assert pasted.stdin is not None
    pasted.stdin.write(line + "\n")
    pasted.stdin.close()
    try:
        status: dict[str, Any] = {}
        began = time.monotonic()
        while not (status.get("state") == "accepted" and status.get("runtime") == "running"):
            assert pasted.poll() is None, log.read_text()
            assert time.monotonic() - began < 90, f"never ran: {status}\n{log.read_text()}"
            time.sleep(0.2)
            with contextlib.suppress(FileNotFoundError, ValueError):
                status = json.loads((data / "status.json").read_text())
        assert status["jobs"]["job_user"] == "own uids 61184-65519", status
        ran = cli(
            "job", "run", "--node", str(status["node_id"]), "--", "sh", "-c",
            "id -u; grep -c '^oz0-job:' /etc/passwd || true", env=env,
        )  # fmt: skip
        assert ran.code == 0, ran.err + log.read_text()
        uid, found = ran.out.split()
        assert int(uid) in DEFAULT_RANGE and found == "0", ran.out
        assert cli("node", "purge", str(status["node_id"]), "--yes", env=env).code == 0
        assert pasted.wait(60) == 0, log.read_text()
    finally:
        if pasted.poll() is None:
            pasted.send_signal(signal.SIGTERM)
            try:
                pasted.wait(15)
            except subprocess.TimeoutExpired:
                pasted.kill()
        shutil.rmtree(data, ignore_errors=True)
    assert "does not exist" not in log.read_text()
    assert left_of(int(uid)) == []
