"""Each attempt's own UID, on this machine's real parts (root): the claims that hold a UID
while its attempt lives and until nothing of it is left (oz0_node/jobs/attempt_uids.py),
the sweep of a UID's processes, System V IPC objects and files (uid_sweep.py), the check
that nothing on the machine uses the range, and the attempt's own /tmp (private_tmp.py).
Starts no server and binds no address. The UIDs used here lie below the agents' default
range, so agents of other tests running meanwhile never meet them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from oz0_node.jobs import isolation as isolation_module
from oz0_node.jobs import uid_sweep
from oz0_node.jobs.attempt_uids import (
    DEFAULT_RANGE,
    NoFreeUid,
    UidClaims,
    UidRange,
    check_machine,
)
from oz0_node.jobs.isolation import Isolation, Limits
from oz0_node.jobs.private_tmp import HELD, PrivateTmp
from oz0_node.jobs.tracking import SUBREAPER

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (other UIDs)")

# Not in DEFAULT_RANGE, not an account's (checked by the fixture).
TEST_RANGE = UidRange(60871, 60879)


def as_uid(uid: int, *command: str) -> list[str]:
    """COMMAND run as UID and GID UID, no supplementary group (as an attempt runs)."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *command]


@pytest.fixture
def uid() -> Iterator[int]:
    """A UID of TEST_RANGE no one else uses now; whatever a test left of it is swept."""
    assert not set(range(TEST_RANGE.first, TEST_RANGE.last + 1)) & set(DEFAULT_RANGE_UIDS)
    chosen = TEST_RANGE.first + os.getpid() % len(TEST_RANGE)
    yield chosen
    uid_sweep.sweep(chosen)


DEFAULT_RANGE_UIDS = range(DEFAULT_RANGE.first, DEFAULT_RANGE.last + 1)


def test_a_range_is_first_to_last_above_the_accounts() -> None:
    assert UidRange.parse("61184-65519") == DEFAULT_RANGE
    assert len(DEFAULT_RANGE) == 4336 and 61184 in DEFAULT_RANGE and 65520 not in DEFAULT_RANGE
    for bad, says in (
        ("61184", "must be FIRST-LAST"),
        ("65519-61184", "LAST at least FIRST"),
        ("0-100", "at least 1000"),
        ("70000-4294967295", "at most 4294967293"),
    ):
        with pytest.raises(ValueError, match=says):
            UidRange.parse(bad)


def test_claims_give_each_holder_its_own_uid_and_none_while_all_are_held(
    tmp_path: Path,
) -> None:
    claims = UidClaims(UidRange(60871, 60873), tmp_path / "uids")
    claims.ensure_directory()
    held = [claims.take(f"attempt-{n}") for n in range(3)]
    assert sorted(c.uid for c in held) == [60871, 60872, 60873]
    assert claims.claimed() == {60871, 60872, 60873}
    swept: list[int] = []

    def sweep(u: int) -> uid_sweep.Swept:
        swept.append(u)
        return uid_sweep.Swept()

    with pytest.raises(NoFreeUid, match="every UID of 60871-60873 is in use"):
        claims.take("attempt-4", sweep)
    assert swept == [], "a held claim is never swept"
    held[1].release()
    again = claims.take("attempt-5")
    assert again.uid == held[1].uid
    assert (tmp_path / "uids").stat().st_mode & 0o777 == 0o700
    assert (tmp_path / "uids" / str(again.uid)).stat().st_mode & 0o777 == 0o600


def test_a_dead_holders_claim_is_swept_and_given_again_only_once_nothing_is_left(
    tmp_path: Path,
) -> None:
    """A supervisor killed with -9 leaves its claim: stale once its lock is gone. The UID is
    swept before it is given again, and stays claimed while the sweep leaves something."""
    directory = tmp_path / "uids"
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from oz0_node.jobs.attempt_uids import UidClaims, UidRange
        claims = UidClaims(UidRange(60874, 60874), Path({str(directory)!r}))
        claims.ensure_directory()
        print(claims.take("attempt-1").uid, flush=True)
        time.sleep(600)
    """)
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    assert holder.stdout.readline().strip() == "60874"
    claims = UidClaims(UidRange(60874, 60874), directory)
    calls: list[int] = []

    def leaves_something(u: int) -> uid_sweep.Swept:
        calls.append(u)
        return uid_sweep.Swept(left=["/tmp/x: Operation not permitted"])

    with pytest.raises(NoFreeUid):
        claims.take("attempt-2", leaves_something)
    assert calls == [], "its holder lives: not swept"
    holder.kill()
    holder.wait()
    holder.stdout.close()
    with pytest.raises(NoFreeUid):
        claims.take("attempt-2", leaves_something)
    assert calls == [60874] and claims.claimed() == {60874}, "left something: kept"

    def clean(u: int) -> uid_sweep.Swept:
        calls.append(u)
        return uid_sweep.Swept(files=2)

    taken = claims.take("attempt-3", clean)
    assert taken.uid == 60874 and calls == [60874, 60874]


def test_the_sweep_ends_the_uids_processes_and_removes_its_ipc_and_files_following_no_link(
    uid: int, tmp_path: Path
) -> None:
    # Outside, the agent's: what a link planted by the job names must stay as it is.
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("root's")
    shared = Path(f"/tmp/oz0-test-shared-{uid}")
    shared.mkdir(mode=0o777, exist_ok=True)
    shared.chmod(0o1777)
    mine = Path(f"/tmp/oz0-test-mine-{uid}")
    plant = textwrap.dedent(f"""
        set -e
        mkdir -p {mine}
        ln -s {victim} {mine}/to-victim
        ln -s {victim / "keep"} {mine}/to-keep
        cd {mine}; i=0; while [ $i -lt 40 ]; do mkdir d; cd d; i=$((i+1)); done; echo deep > f
        echo x > {shared}/theirs-{uid}
        echo x > /dev/shm/oz0-test-{uid}
        echo x > /var/tmp/oz0-test-{uid}
        chmod 0500 {mine}
        ipcmk -M 4096 >/dev/null; ipcmk -S 1 >/dev/null; ipcmk -Q >/dev/null
        setsid sleep 600 </dev/null >/dev/null 2>&1 &
        (sleep 600 &) </dev/null >/dev/null 2>&1
    """)
    subprocess.run(as_uid(uid, "sh", "-c", plant), check=True, timeout=30)
    assert len([p for p in uid_sweep.processes(lambda u: u == uid) if not p.zombie]) == 2
    assert {o.kind for o in uid_sweep.ipc_objects(lambda u: u == uid)} == {"shm", "sem", "msg"}
    swept = uid_sweep.sweep(uid)
    assert swept.clean, swept.left
    assert swept.processes == 2 and swept.ipc == 3
    # mine (1 + 2 links + 40 directories + f), the shared dir's file, /dev/shm, /var/tmp.
    assert swept.files == 1 + 2 + 40 + 1 + 3, swept
    assert swept.describe() == "ended 2 processes, removed 3 IPC objects, removed 47 files"
    # Zombies are ended (this container's PID 1 may be slow to reap the orphans' own).
    assert all(p.zombie for p in uid_sweep.processes(lambda u: u == uid))
    assert not uid_sweep.ipc_objects(lambda u: u == uid)
    for place in uid_sweep.SHARED_PLACES:
        assert uid_sweep.first_owned(place, lambda u: u == uid) is None
    assert not mine.exists() and shared.is_dir() and not list(shared.iterdir())
    assert (victim / "keep").read_text() == "root's" and victim.stat().st_uid == 0
    assert uid_sweep.sweep(uid).describe() == "nothing left"
    shared.rmdir()


def test_a_tree_deeper_than_the_walk_opens_is_removed_whole(tmp_path: Path) -> None:
    """Three times MAX_DEPTH deep, removed by a process that may open MAX_DEPTH descriptors
    (and a few): directories are moved up, not opened deeper."""
    top = tmp_path / "top"
    deep = top.joinpath(*["d"] * (uid_sweep.MAX_DEPTH * 3 + 5))
    deep.mkdir(parents=True)
    (deep / "f").write_text("x")
    script = textwrap.dedent(f"""
        import os, resource
        from pathlib import Path
        from oz0_node.jobs import uid_sweep
        fd = os.open({str(tmp_path)!r}, os.O_RDONLY | os.O_DIRECTORY)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (fd + uid_sweep.MAX_DEPTH + 4, hard))
        print(uid_sweep.remove_tree_at(fd, "top", Path({str(top)!r}).lstat()))
    """)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == f"({uid_sweep.MAX_DEPTH * 3 + 5 + 2}, [])", done.stdout
    assert not top.exists()


def test_a_directory_the_uid_could_not_enter_is_not_walked(uid: int, tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    (closed / "f").write_text("x")
    os.chown(closed / "f", uid, uid)  # root's doing: no job could have put it there
    assert uid_sweep.first_owned(tmp_path, lambda u: u == uid) is None
    closed.chmod(0o701)
    assert uid_sweep.first_owned(tmp_path, lambda u: u == uid) == (closed / "f", uid)


def test_the_machine_check_names_what_uses_the_range_unless_it_is_claimed(
    uid: int, tmp_path: Path
) -> None:
    claims = UidClaims(TEST_RANGE, tmp_path / "uids")
    claims.ensure_directory()
    assert check_machine(claims) is None
    nobody = UidClaims(UidRange(65500, 65535), tmp_path / "uids")
    refused = check_machine(nobody)
    # nobody (65534), or an account whose group is nogroup (65534), such as Debian's sync.
    assert refused is not None and "the account " in refused and " 65534" in refused
    assert refused.startswith("the job UIDs 65500-65535 are not free on this machine: ")
    assert refused.endswith("; give another range with --job-uids FIRST-LAST, or --job-user NAME")

    sleeper = subprocess.Popen(as_uid(uid, "sleep", "600"))
    try:
        deadline = time.monotonic() + 5
        # The sleeper once it has its UID (zombies of earlier tests' do not count).
        while not any(
            p.pid == sleeper.pid and not p.zombie for p in uid_sweep.processes(lambda u: u == uid)
        ):
            assert time.monotonic() < deadline, "the sleeper never took its UID"
            time.sleep(0.01)
        refused = check_machine(claims)
        assert refused is not None and f"process {sleeper.pid} runs as uid {uid}/" in refused
    finally:
        sleeper.send_signal(signal.SIGKILL)
        sleeper.wait()
    left = Path(f"/var/tmp/oz0-test-left-{uid}")
    left.write_text("x")
    os.chown(left, uid, uid)
    refused = check_machine(claims)
    assert refused is not None and f"{left} belongs to uid {uid}" in refused
    # Claimed: an attempt's (of this agent or another), not a stranger's.
    (claims.directory / str(uid)).write_text("{}")
    assert check_machine(claims) is None
    left.unlink()


@pytest.mark.parametrize("starting", [1, 2, 3])
def test_attempts_starting_during_the_machine_check_are_not_taken_for_strangers(
    uid: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, starting: int
) -> None:
    """Other agents' attempts take UIDs (a claim, then a working directory in /tmp) while
    the check looks: one during each of the first STARTING looks of /tmp, so each look finds
    the newest. Each had a claim by the time that look ended: an attempt's, not a stranger's.
    Then they end, and a stranger's file is found twice, and named."""
    claims = UidClaims(TEST_RANGE, tmp_path / "uids")
    claims.ensure_directory()
    workdirs: list[Path] = []
    real_first_owned = uid_sweep.first_owned

    def first_owned(top: Path, match: uid_sweep.Match) -> tuple[Path, int] | None:
        if top == Path("/tmp") and len(workdirs) < starting:
            claim = claims.take("another agent")
            workdir = Path(f"/tmp/oz0-job-test-check-{os.getpid()}-{len(workdirs)}")
            workdir.mkdir(mode=0o700)
            workdirs.append(workdir)
            os.chown(workdir, claim.uid, claim.uid)
        return real_first_owned(top, match)

    monkeypatch.setattr(uid_sweep, "first_owned", first_owned)
    try:
        assert check_machine(claims) is None
        assert len(workdirs) == starting
    finally:
        for workdir in workdirs:
            workdir.rmdir()
        for taken in claims.claimed():
            claims.path(taken).unlink()
    left = Path(f"/var/tmp/oz0-test-stranger-{uid}")
    left.write_text("x")
    os.chown(left, uid, uid)
    try:
        refused = check_machine(claims)
        assert refused is not None and f"{left} belongs to uid {uid}" in refused
    finally:
        left.unlink()


def test_a_working_directory_left_behind_is_swept_before_its_uid_is_given_up(
    uid: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt had its own /tmp (so the sweep spares the machine's), but the removal of
    its working directory, which lies in the machine's /tmp, failed: the sweep takes the
    machine's /tmp too, and the UID is given up only once the directory is gone (left with
    no claim, it would stop the next agent's start as a stranger's)."""
    claims = UidClaims(UidRange(uid, uid), tmp_path / "uids")
    isolation = Isolation(tmp_path, None, drop=True, tracking=SUBREAPER, uids=claims)
    placement = isolation.begin("node-1", "job-uid-left", 1, {}, Limits())
    assert placement.claim is not None and placement.claim.uid == uid
    assert placement.workdir.parent == Path(tempfile.gettempdir())
    assert placement.workdir.stat().st_uid == uid
    assert placement.private is not None
    monkeypatch.setattr(placement.private, "outcome", lambda: HELD)
    monkeypatch.setattr(isolation_module, "remove_tree", lambda path, as_user=None: None)
    isolation.end(placement)
    assert not placement.workdir.exists()
    assert placement.applied["swept"] == "removed 1 file"
    assert claims.claimed() == set(), "nothing left: the UID is free again"


def test_the_attempts_own_tmp_hides_the_machines_and_goes_with_it(tmp_path: Path) -> None:
    workdir = Path(f"/tmp/oz0-job-test-private-{os.getpid()}")
    workdir.mkdir(mode=0o700)
    try:
        steps = PrivateTmp(workdir)
        shown = subprocess.run(
            ["sh", "-c", "ls -A /tmp /var/tmp; pwd; echo x > /tmp/written; echo y > here"],
            cwd=workdir,
            preexec_fn=steps,  # as the supervisor (one thread) runs it
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert steps.outcome() == HELD
        assert shown.stdout.split("\n") == [
            "/tmp:",
            workdir.name,
            "",
            "/var/tmp:",  # nothing of the machine's
            str(workdir),
            "",
        ], shown.stdout
        assert not Path("/tmp/written").exists(), "written in its own /tmp, gone with it"
        assert (workdir / "here").read_text() == "y\n", "its working directory is the real one"
    finally:
        for f in workdir.iterdir():
            f.unlink()
        workdir.rmdir()


def test_where_the_kernel_refuses_a_namespace_the_command_runs_with_the_machines_tmp(
    tmp_path: Path,
) -> None:
    """No CAP_SYS_ADMIN (a container's root): unshare is refused, the command runs anyway,
    and the outcome says why."""
    script = textwrap.dedent(f"""
        import subprocess
        from pathlib import Path
        from oz0_node.jobs.private_tmp import PrivateTmp
        steps = PrivateTmp(Path({str(tmp_path)!r}))
        subprocess.run(["true"], preexec_fn=steps, check=True)
        print(steps.outcome())
    """)
    done = subprocess.run(
        ["setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin", "--",
         sys.executable, "-c", script],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "not applied: unshare: Operation not permitted"
