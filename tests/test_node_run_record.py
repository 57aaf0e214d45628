"""The node's record of the attempts it ran fails closed (oz0_node/jobs/grants.py), with a
real server and a real agent (127.0.0.63): an agent that finds DATA_DIR/attempts-run
unreadable runs no attempt, says so and how to repair it in its log and in `oz0-node
status`, and runs attempts again once it is repaired, without a restart; one that cannot
write it (its disk full) runs none and the job says so, not that its node was lost."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.agent import AgentProcess
from fixtures.cluster import REPO, ClusterFiles, StartServer
from fixtures.polling import wait_until
from tests.conftest import CliRunner

SERVER = "127.0.0.63"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
NONE_RUN = "no attempt runs here until it is repaired"


@pytest.fixture
def one_server(cluster_files: ClusterFiles, start_server: StartServer) -> Iterator[ClusterFiles]:
    start_server(cluster_files, SERVER)
    yield cluster_files


def status_text(agent: AgentProcess) -> str:
    """`oz0-node status` as a person reads it."""
    done = subprocess.run(
        [sys.executable, "-m", "oz0_node.main", "status", "--data-dir", str(agent.data_dir)],
        capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=30,
        check=True,
    )  # fmt: skip
    return done.stdout


@pytest.mark.slow
def test_an_unreadable_record_of_attempts_run_stops_every_attempt_until_repaired(
    cli: CliRunner, one_server: ClusterFiles, tmp_path: Path, agents: list[AgentProcess]
) -> None:
    files, env = one_server, one_server.cli_env
    token = cli("token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=env)
    assert token.code == 0, token.err
    data_dir = tmp_path / "node"
    agent = AgentProcess.joining(data_dir, [EDGE], files.ca_hash, token=token.json()["token"])
    agents.append(agent.start())
    node = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)["node_id"]
    ran = cli("job", "run", "--node", node, "--", "true", env=env)
    assert ran.code == 0, ran.err
    record = data_dir / "attempts-run"
    assert record.exists()

    # Damaged while the agent is down (a disk error, a crash mid-write, a person's edit).
    agent.stop()
    record.write_text('{"job-0123456789ab/1": 17')
    agent = AgentProcess.resuming(data_dir)
    agents.append(agent.start())
    status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    not_run = status["jobs"]["not_run"]
    assert not_run.startswith(f"cannot read {record}") and NONE_RUN in not_run, not_run
    assert f"jobs:      NONE RUN: {not_run}\n" in status_text(agent)
    assert [line for line in agent.log().splitlines() if NONE_RUN in line], agent.log()

    # The mark where an attempt may touch it: not /tmp (each attempt's own), and root's,
    # as the sweep removes what an attempt's UID owns. A touch is seen in its time.
    marks = Path(tempfile.mkdtemp(prefix="oz0-test-run-record-", dir="/dev/shm"))
    marks.chmod(0o755)
    mark = marks / "ran"
    mark.touch()
    mark.chmod(0o666)
    os.utime(mark, (0, 0))
    try:
        refused = cli("job", "run", "--node", node, "--", "touch", str(mark), env=env)
        assert refused.code != 0
        assert f"node {node} refused attempt 1: cannot read {record}" in refused.err, refused.err
        assert NONE_RUN in refused.err
        assert mark.stat().st_mtime == 0, "the attempt ran"
        assert record.read_text() == '{"job-0123456789ab/1": 17', "never written over"

        # Repaired: the next attempt runs, with no restart, and the status says no more.
        record.unlink()
        ran = cli("job", "run", "--node", node, "--", "touch", str(mark), env=env)
        assert ran.code == 0, ran.err
        assert mark.stat().st_mtime > 0
        agent.wait_status(lambda s: "not_run" not in (s.get("jobs") or {}), timeout=10)
        assert "NONE RUN" not in status_text(agent)
        assert "is readable again" in agent.log()
    finally:
        shutil.rmtree(marks)


def fill(path: Path) -> None:
    """Zeros written to PATH until its file system has not a page left."""
    with path.open("wb", buffering=0) as out:
        for size in (1 << 20, 4096):
            with contextlib.suppress(OSError):
                while True:
                    out.write(b"\0" * size)


@pytest.mark.slow
def test_an_attempt_its_node_cannot_record_ends_saying_so_not_that_its_node_was_lost(
    cli: CliRunner,
    one_server: ClusterFiles,
    tmp_path: Path,
    agents: list[AgentProcess],
    request: pytest.FixtureRequest,
) -> None:
    """bench.soak's disk_full: the node's data directory full, the node fails the attempt
    (RecordUnwritable) and it moves; the attempt ends `node could not record the attempt`
    (not `node lost`: the node was there all along), with the node's
    words (which file, why) as its detail, in the text and --json. --no-move: the job
    ends at that first end, its reason saying the same."""
    if os.geteuid() != 0:
        pytest.skip("mounts a tmpfs")
    files, env = one_server, one_server.cli_env
    token = cli("token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=env)
    assert token.code == 0, token.err
    disk = tmp_path / "disk"
    disk.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", str(disk)],
        check=True, capture_output=True,
    )  # fmt: skip
    request.addfinalizer(lambda: subprocess.run(["umount", "-l", str(disk)], check=False))
    data_dir = disk / "node"
    agent = AgentProcess.joining(data_dir, [EDGE], files.ca_hash, token=token.json()["token"])
    agents.append(agent.start())
    node = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)["node_id"]
    fill(disk / "filler")
    try:
        made = cli("job", "run", "--no-move", "--detach", "--json", "--", "true", env=env)
        assert made.code == 0, made.err
        job_id = made.json()["id"]

        def ended() -> dict[str, Any] | None:
            shown = cli("job", "show", job_id, "--json", env=env)
            job: dict[str, Any] = shown.json() if shown.code == 0 else {}
            return job if job.get("ended_at") else None

        job = wait_until(ended, 60, f"{job_id} ended", step=0.5, detail=agent.log)
    finally:
        (disk / "filler").unlink()
    [first] = job["attempts"]
    record = data_dir / "attempts-run"
    said = f"cannot record the attempt as run in {record}: No space left on device"
    assert (first["node"], first["ended_because"]) == (node, "node could not record the attempt")
    assert first["ended_detail"] == said, first
    assert (job["state"], job["reason"]) == (
        "lost", "attempt 1: node could not record the attempt (--no-move)"
    )  # fmt: skip
    text = cli("job", "show", job_id, env=env)
    assert text.code == 0, text.err
    assert "node could not record the attempt" in text.out and "node lost" not in text.out
    assert f"attempt 1 on {node}: {said}\n" in text.out, text.out
