"""The pure parts of a job attempt's isolation (oz0_node/jobs/procfs.py, isolation.py): what
/proc's mountinfo, cgroup and stat files say, which processes descend from which, a
recorded PID told from a later process that reused it, the attempt's limits, the job user
and the checks of the data directory. Starts no server and binds no address."""

from __future__ import annotations

import logging
import os
import pwd
import subprocess
import time
from pathlib import Path

import pytest

from oz0_node import agent, main
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir
from oz0_node.jobs import procfs, tracking
from oz0_node.jobs.attempt_uids import DEFAULT_RANGE, UidRange
from oz0_node.jobs.isolation import Isolation, Limits, parse_limits
from oz0_node.jobs.job_user import DEFAULT_JOB_USER, check_private, resolve_job_user
from oz0_node.jobs.procfs import Mount, ProcStat
from oz0_node.jobs.tracking import SUBREAPER, SubreaperTracking

# This machine's: cgroup v1 hierarchies and a v2 one at /sys/fs/cgroup/unified.
HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime shared:5 - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""
HYBRID_CGROUP = """\
8:pids:/
4:memory:/process_api/a3d1
1:cpu:/
0::/
"""


def test_mountinfo_gives_each_cgroup_hierarchys_mount_point_and_controllers() -> None:
    mounts = procfs.parse_mountinfo(HYBRID + "garbage line\n")
    assert len(mounts) == 6
    assert mounts[-1] == Mount("/", Path("/sys/fs/cgroup/unified"), "cgroup2", ("rw",))
    assert mounts[3].super_options == ("rw", "memory")
    assert mounts[4].fstype == "cgroup", "an optional field (shared:5) before the dash"
    own = procfs.parse_proc_cgroup(HYBRID_CGROUP)
    assert own == {"pids": "/", "memory": "/process_api/a3d1", "cpu": "/", "": "/"}
    assert procfs.cgroup_dir(mounts, own, "") == Path("/sys/fs/cgroup/unified")
    assert procfs.cgroup_dir(mounts, own, "memory") == Path(
        "/sys/fs/cgroup/memory/process_api/a3d1"
    )
    assert procfs.cgroup_dir(mounts, own, "cpu") == Path("/sys/fs/cgroup/cpu"), "not cpuacct"
    assert procfs.cgroup_dir(mounts, own, "hugetlb") is None


def test_a_pure_v2_machine_under_systemd_and_a_containers_view_of_it() -> None:
    mounts = procfs.parse_mountinfo(
        "30 24 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    )
    own = procfs.parse_proc_cgroup("0::/system.slice/oz0-node.service\n")
    assert procfs.cgroup_dir(mounts, own, "") == Path(
        "/sys/fs/cgroup/system.slice/oz0-node.service"
    )
    assert procfs.cgroup_dir(mounts, own, "memory") is None, "no v1 hierarchy at all"
    # A container sees only its part (mount root /docker/abc): paths are below that root.
    inside = procfs.parse_mountinfo(
        r"40 30 0:26 /docker/abc /sys/fs/cgroup\040x rw - cgroup2 cgroup2 rw" + "\n"
    )
    assert inside[0].mount_point == Path("/sys/fs/cgroup x"), "\\040 is a space"
    assert procfs.cgroup_dir(inside, {"": "/docker/abc/agent"}, "") == Path(
        "/sys/fs/cgroup x/agent"
    )
    assert procfs.cgroup_dir(inside, {"": "/elsewhere"}, "") is None


def test_stat_fields_are_counted_after_the_last_parenthesis_of_the_name() -> None:
    tail = b" ".join([b"0"] * 15) + b" 4242 0 0"  # fields 7-21, starttime (22), more
    text = b"123 (a) b) (c) S 1 77 77 " + tail
    assert procfs.parse_stat(123, text) == ProcStat(123, "S", 1, 77, start_time=4242)
    assert procfs.parse_stat(1, b"1 (init) Z 0 0 0 " + tail).zombie  # type: ignore[union-attr]
    assert procfs.parse_stat(1, b"1 (short) S 0") is None
    me = procfs.read_stat(os.getpid())
    assert me is not None and me.ppid == os.getppid() and not me.zombie


def test_descendants_follow_parent_chains_and_nothing_else() -> None:
    stats = [
        ProcStat(10, "S", 1, 10, 0),
        ProcStat(11, "S", 10, 10, 0),
        ProcStat(12, "S", 11, 12, 0),  # setsid'd grandchild: still a descendant
        ProcStat(20, "S", 1, 20, 0),
        ProcStat(21, "S", 20, 20, 0),
    ]
    assert procfs.descendants({10}, stats) == {10, 11, 12}
    assert procfs.descendants({99}, stats) == {99}


def test_a_pid_is_the_recorded_process_only_with_its_start_time() -> None:
    with subprocess.Popen(["sleep", "30"]) as other:
        try:
            stat = procfs.read_stat(other.pid)
            assert stat is not None
            # The same process, read again (its state may have changed meanwhile: a sleep
            # just started is seen running, then sleeping).
            again = procfs.same_process(other.pid, stat.start_time)
            assert again is not None
            assert (again.pid, again.ppid, again.start_time) == (
                other.pid,
                os.getpid(),
                stat.start_time,
            )
            assert procfs.same_process(other.pid, stat.start_time + 1) is None
        finally:
            other.kill()
    assert procfs.same_process(other.pid, stat.start_time) is None


def test_subreaper_tracking_follows_a_setsid_grandchild_and_reaps_it(tmp_path: Path) -> None:
    tracking = SubreaperTracking({"OZ0_JOB_ID": "none"})
    with subprocess.Popen(
        ["sh", "-c", "setsid sleep 30 & echo $!; wait"], stdout=subprocess.PIPE, text=True
    ) as shell:
        assert shell.stdout is not None
        grandchild = int(shell.stdout.readline())
        tracking.started(shell.pid)
        assert tracking.refresh() is True
        assert set(tracking.alive()) == {shell.pid, grandchild}
        assert [grandchild, procfs.read_stat(grandchild).start_time] in tracking.recorded()  # type: ignore[union-attr]
        tracking.kill_all()
        deadline = time.monotonic() + 5
        while tracking.alive():  # SIGKILL takes a moment to land
            assert time.monotonic() < deadline, tracking.alive()
            time.sleep(0.02)


def test_limits_parse_each_key_and_refuse_bad_values() -> None:
    assert parse_limits(None) == Limits()
    parsed = parse_limits({"memory": 1 << 30, "cpu": 1, "max_processes": None, "gpu": 1})
    assert parsed == Limits(memory=1 << 30, cpu=1.0, unknown=("gpu",))
    assert isinstance(parsed, Limits) and parsed.asked() == ["memory", "cpu"]
    bads: list[object] = [
        [],
        {"memory": 0},
        {"memory": 1.5},
        {"cpu": -0.5},
        {"cpu": float("inf")},
        {"max_open_files": True},
        {"address_space": "1G"},
    ]
    for bad in bads:
        assert isinstance(parse_limits(bad), str), bad


def test_each_attempt_has_its_own_uid_by_default_an_account_when_named_root_when_said(
    tmp_path: Path, job_user: str
) -> None:
    assert resolve_job_user(None, euid=0) is None, "no account: each attempt its own UID"
    assert resolve_job_user("root", euid=0).uid == 0  # type: ignore[union-attr]
    with pytest.raises(AgentError, match="the job user no-such-oz0-user does not exist"):
        resolve_job_user("no-such-oz0-user", euid=0)
    # An agent that is not root: its jobs run as itself, and it cannot be told otherwise.
    with pytest.raises(AgentError, match="only an agent running as root"):
        resolve_job_user(DEFAULT_JOB_USER, euid=1234)
    own = Isolation.detect(tmp_path, tracking=SUBREAPER)
    assert own.user is None and own.uids is not None and own.drop
    assert own.uids.range == DEFAULT_RANGE
    assert own.describe("node-1") == {"job_user": "own uids 61184-65519", "tracking": SUBREAPER}
    narrow = Isolation.detect(tmp_path, tracking=SUBREAPER, job_uids=UidRange(70000, 70099))
    assert narrow.uids is not None and narrow.uids.range == UidRange(70000, 70099)
    # Named: that account's, shared by all its jobs.
    isolation = Isolation.detect(tmp_path, job_user, tracking=SUBREAPER)
    assert isolation.user is not None and isolation.uids is None
    user = pwd.getpwnam(job_user)
    assert (isolation.user.uid, isolation.user.gid) == (user.pw_uid, user.pw_gid)
    assert isolation.user.groups == tuple(os.getgrouplist(job_user, user.pw_gid))
    assert isolation.drop and isolation.describe("node-1") == {
        "job_user": job_user,
        "tracking": SUBREAPER,
    }
    with pytest.raises(AgentError, match="--job-uids is for attempts that each run as a UID"):
        Isolation.detect(tmp_path, job_user, job_uids=UidRange(70000, 70099))


def test_job_uids_that_do_not_parse_or_are_in_use_stop_the_agent_before_any_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["start", "--data-dir", str(tmp_path / "node"), "--edge", "edge.invalid:7443"]
    args += ["--ca-hash", "sha256:" + "0" * 64]
    assert main.run([*args, "--job-uids", "5-1"]) == 1
    assert "--job-uids 5-1: FIRST must be at least 1000" in capsys.readouterr().err
    # nobody (65534) has one of these.
    assert main.run([*args, "--job-uids", "65530-65535"]) == 1
    err = capsys.readouterr().err
    assert "the job UIDs 65530-65535 are not free on this machine: the account " in err
    assert "edge.invalid" not in err, "it stopped before reaching for the edge"


def test_a_data_dir_open_to_others_is_closed_by_root_and_refused_otherwise(
    tmp_path: Path,
) -> None:
    data = tmp_path / "node"
    data.mkdir(mode=0o755)
    data.chmod(0o755)
    with pytest.raises(AgentError, match=r"open to group or others \(mode 755\)"):
        check_private([data], enforce=False)
    check_private([data], enforce=True)
    assert data.stat().st_mode & 0o777 == 0o700
    os.chown(data, 1, 1)
    with pytest.raises(AgentError, match="is owned by uid 1, not by the agent's user"):
        check_private([data], enforce=True)


def test_an_agent_without_its_job_user_refuses_to_start_before_any_network(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "node"
    args = ["start", "--data-dir", str(data), "--edge", "edge.invalid:7443"]
    args += ["--ca-hash", "sha256:" + "0" * 64, "--job-user", "no-such-oz0-user"]
    assert main.run(args) == 1
    err = capsys.readouterr().err
    assert "the job user no-such-oz0-user does not exist, so no job can run" in err
    assert "edge.invalid" not in err, "it stopped before reaching for the edge"


def test_jobs_as_root_must_be_said_and_the_log_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="oz0_node.agent")
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    isolation = agent.prepare_jobs(
        agent.StartOptions(data_dir=identity.data_dir, job_user="root"), identity, None
    )
    assert isolation.user is not None and isolation.user.uid == 0 and not isolation.drop
    assert "jobs run as root (--job-user root)" in caplog.text
    caplog.clear()
    agent.prepare_jobs(agent.StartOptions(data_dir=identity.data_dir), identity, None)
    assert "jobs run as own uids 61184-65519, tracked by" in caplog.text
    assert "jobs run as root" not in caplog.text


def test_an_attempts_cgroup_is_made_again_when_its_parent_goes_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another attempt's supervisor ends and removes the node's emptied subtree between
    this one making sure it is there and making its own cgroup in it (seen: exit 126,
    "cannot make its working directory or cgroup", in a burst of 200 jobs on 20 nodes)."""
    parent = tmp_path / "oz0-node-node-a"
    made = Path.mkdir
    vanished: list[Path] = []

    def racing_mkdir(self: Path, *args: object, **kwargs: object) -> None:
        if self.parent == parent and not vanished:
            parent.rmdir()  # the other supervisor's isolation.end, just now
            vanished.append(self)
        made(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", racing_mkdir)
    cgroup = tracking.fresh_cgroup(parent, "job-000000000001-1", v2=False)
    assert vanished and cgroup.is_dir() and cgroup.parent == parent
