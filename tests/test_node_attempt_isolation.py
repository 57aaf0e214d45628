"""An attempt's isolation on the node: nothing it left outlives it (cgroup v2 or subreaper
tracking), it cannot read the node's identity, its memory limit holds, and a recorded PID
now another process's is never touched.

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from fixtures.attempt_processes import all_gone, isolation_for, own_uid
from fixtures.node_attempts import (
    JOB,
    NODE_ID,
    RecordingEdge,
    printed_pids,
    run_attempt,
    sign,
    spec,
    unsigned,
)
from oz0_node.jobs.isolation import RECORD_FILE, Isolation
from oz0_node.jobs.procfs import read_stat
from oz0_node.jobs.tracking import CGROUP_V2, SUBREAPER

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
    edge = RecordingEdge()
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
    edge = RecordingEdge()
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
    edge = RecordingEdge()
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
