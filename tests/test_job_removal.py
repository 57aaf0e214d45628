"""Removing an attempt's working directory (oz0_node/jobs/removal.py) while a job swaps its
entries for symbolic links: nothing outside the directory changes (modes, owners,
contents), whether the removal runs as root alone or first as the job's user. The swaps
are faults injected at the moment the removal looks at an entry (the system calls it
makes, wrapped), and a job-like thread racing it in a loop. Runs as root; starts no server
and binds no address."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from oz0_node.jobs import procfs, removal
from oz0_node.jobs.job_user import DEFAULT_JOB_USER, JobUser
from oz0_node.jobs.removal import remove_tree

# Someone else: neither root nor the job's user.
NOBODY = 65534
JOB_USER = JobUser.named(DEFAULT_JOB_USER)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or JOB_USER is None, reason="needs root and the job user"
)

Snapshot = dict[str, tuple[int, int, int, bytes | None]]


def owned_entries(top: Path) -> Snapshot:
    """Every entry under TOP (TOP too) with its mode, owner, group and content (a file's,
    a link's target), links never followed."""
    found: Snapshot = {}
    for root, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            path = Path(root, name)
            st = path.lstat()
            if stat.S_ISREG(st.st_mode):
                content: bytes | None = path.read_bytes()
            elif stat.S_ISLNK(st.st_mode):
                content = os.fsencode(path.readlink())
            else:
                content = None
            found[str(path.relative_to(top))] = (st.st_mode, st.st_uid, st.st_gid, content)
    return found


@pytest.fixture
def temp_root() -> Iterator[Path]:
    """A directory like /tmp (root's, 1777, sticky): where a job's working directory is."""
    path = Path(tempfile.mkdtemp(prefix="oz0-removal-test-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def outside() -> Iterator[Path]:
    """Someone else's directory outside the job's, writable by all (so that the job's user
    too could change it, if the removal followed a link there), with known modes."""
    top = Path(tempfile.mkdtemp(prefix="oz0-removal-victim-", dir="/tmp"))
    (top / "keep").write_bytes(b"precious\n")
    (top / "inner").mkdir()
    (top / "inner" / "deep").write_bytes(b"also precious\n")
    for path, mode in ((top / "inner" / "deep", 0o640), (top / "inner", 0o705),
                       (top / "keep", 0o644), (top, 0o757)):  # fmt: skip
        os.chown(path, NOBODY, NOBODY)
        path.chmod(mode)
    yield top
    shutil.rmtree(top, ignore_errors=True)


def job_tree(parent: Path) -> Path:
    """A job's working directory as a job leaves it: files, a directory it made unwritable,
    one to be swapped, all its user's."""
    assert JOB_USER is not None
    top = Path(tempfile.mkdtemp(prefix="oz0-job-job-00000000aaaa-1-", dir=parent))
    (top / "a" / "b").mkdir(parents=True)
    (top / "a" / "b" / "f").write_bytes(b"x")
    (top / "file").write_bytes(b"y")
    (top / "swap").mkdir()
    (top / "swap" / "inside").write_bytes(b"z")
    (top / "locked").mkdir()
    (top / "locked" / "g").write_bytes(b"w")
    for root, dirs, files in os.walk(top):
        for name in [".", *dirs, *files]:
            os.chown(Path(root, name), JOB_USER.uid, JOB_USER.gid)
    (top / "locked").chmod(0o500)
    top.chmod(0o700)
    return top


def swap_for_link(path: Path, target: Path) -> None:
    """What a job does: PATH moved aside and a link to TARGET put in its place."""
    with contextlib.suppress(OSError):
        path.rename(path.with_name(f"{path.name}.moved"))
        path.symlink_to(target)


class Swapper:
    """A fault at one system call of the removal: the first time it is about to act on
    what MATCHES, ACTION runs (a job's swap), once across this process and the job user's
    forked pass. Says which user the removal ran as then."""

    def __init__(self, call: str, matches: Callable[[Any, Any], bool], action: Callable[[], None]):
        self.call, self.matches, self.action = call, matches, action
        self.real: Callable[..., Any] = getattr(os, call)
        # One token: whichever process reads it first does the swap.
        self.token_r, token_w = os.pipe()
        os.write(token_w, b"t")
        os.close(token_w)
        os.set_blocking(self.token_r, False)
        self.said_r, self.said_w = os.pipe()

    def __call__(self, path: Any, *args: Any, **kwargs: Any) -> Any:
        if self.matches(path, kwargs.get("dir_fd")):
            with contextlib.suppress(BlockingIOError):
                if os.read(self.token_r, 1):
                    os.write(self.said_w, f"{os.geteuid()}\n".encode())
                    self.action()
        return self.real(path, *args, **kwargs)

    def fired_as(self) -> list[int]:
        os.close(self.said_w)
        os.close(self.token_r)
        with os.fdopen(self.said_r, "rb") as f:
            return [int(line) for line in f.read().split()]


AS = {"root alone": None, "the job user first": JOB_USER}
WHEN = [
    "an entry swapped before it is opened",
    "a file swapped before it is unlinked",
    "a directory swapped once open, before it is removed",
    "an unwritable directory swapped before its mode is changed",
    "the working directory itself swapped before it is opened",
]


@pytest.mark.one_thread  # the job user's pass is a fork: fixtures/one_thread.py
@pytest.mark.parametrize("as_user", list(AS), ids=list(AS))
@pytest.mark.parametrize("when", WHEN)
def test_a_link_swapped_in_during_the_removal_changes_nothing_outside(
    when: str, as_user: str, temp_root: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    top = job_tree(temp_root)
    before = owned_entries(outside)
    swap_ino = (top / "swap").stat().st_ino
    faults: dict[str, tuple[str, Callable[[Any, Any], bool], Path]] = {
        WHEN[0]: ("open", lambda p, fd: p == "swap" and fd is not None, top / "swap"),
        WHEN[1]: ("unlink", lambda p, fd: p == "file" and fd is not None, top / "file"),
        WHEN[2]: (
            "scandir",
            lambda p, fd: isinstance(p, int) and os.fstat(p).st_ino == swap_ino,
            top / "swap",
        ),
        WHEN[3]: ("unlink", lambda p, fd: p == "g" and fd is not None, top / "locked"),
        WHEN[4]: ("open", lambda p, fd: p == top.name and fd is not None, top),
    }
    call, matches, swapped = faults[when]
    swapper = Swapper(call, matches, lambda: swap_for_link(swapped, outside))
    monkeypatch.setattr(os, call, swapper)
    user = AS[as_user]
    assert user is None or procfs.one_thread(), "the job user's pass is a fork of this one"
    remove_tree(top, as_user=user)
    monkeypatch.undo()
    assert swapper.fired_as() == [user.uid if user is not None else 0], "swapped during it"
    assert owned_entries(outside) == before, "something outside the job's directory changed"
    assert not top.exists() and not top.is_symlink(), "the link itself is removed"
    if swapped == top:
        # Moved aside by the job: out of the removal's reach (the sweep of the job user's
        # files finds it).
        assert sorted(p.name for p in temp_root.iterdir()) == [f"{top.name}.moved"]
    else:
        assert not list(temp_root.iterdir()), "all of it is gone"


# The job user cannot run this test's interpreter (under root's home): the system's.
SYSTEM_PYTHON = "/usr/bin/python3"
# Another attempt of the same user: swaps the directories of the one being removed for links
# to TARGET, over and over, until told to stop; then says how many it swapped.
RACER = """
import os, sys
top, target, stop = sys.argv[1:]
swapped = 0
while not os.path.exists(stop):
    for n in range(20):
        try:
            os.rename(f"{top}/d{n}", f"{top}/d{n}.moved")
            os.symlink(target, f"{top}/d{n}")
            swapped += 1
        except OSError:
            pass
print(swapped)
"""


@pytest.mark.one_thread  # the job user's pass is a fork: fixtures/one_thread.py
@pytest.mark.parametrize("as_user", list(AS), ids=list(AS))
def test_a_job_swapping_links_in_a_loop_while_its_directory_is_removed_changes_nothing_outside(
    as_user: str, temp_root: Path, outside: Path
) -> None:
    assert JOB_USER is not None
    if not Path(SYSTEM_PYTHON).exists():
        pytest.skip(f"no {SYSTEM_PYTHON} for the job user to race with")
    before = owned_entries(outside)
    user = AS[as_user]
    swapped = 0
    for i in range(20):
        top = job_tree(temp_root)
        for n in range(20):
            (top / f"d{n}").mkdir()
            (top / f"d{n}" / "x").write_bytes(b"x")
            os.chown(top / f"d{n}", JOB_USER.uid, JOB_USER.gid)
        stop = temp_root.parent / f"{temp_root.name}-stop-{i}"
        racer = subprocess.Popen(
            [SYSTEM_PYTHON, "-c", RACER, str(top), str(outside), str(stop)],
            user=JOB_USER.uid, group=JOB_USER.gid, extra_groups=[], stdout=subprocess.PIPE,
        )  # fmt: skip
        try:
            while not any(p.name.endswith(".moved") for p in top.iterdir()):
                time.sleep(0.001)  # it runs
            remove_tree(top, as_user=user)
        finally:
            stop.touch()
            out, _ = racer.communicate(timeout=10)
            stop.unlink()
        swapped += int(out)
        remove_tree(top)  # what it swapped in after the removal was done
        assert owned_entries(outside) == before, "something outside the job's directory changed"
    assert swapped > 20, "the racer swapped links in while the directories were removed"
    assert not list(temp_root.iterdir())


def test_directories_deeper_than_the_descriptors_held_are_removed(temp_root: Path) -> None:
    top = Path(tempfile.mkdtemp(prefix="oz0-job-", dir=temp_root))
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(removal.MAX_DEPTH * 3 + 7):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = inner
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))
    finally:
        os.close(fd)
    # Fewer descriptors than the depth would take, held one a level.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (2 * removal.MAX_DEPTH + 64, hard))
    try:
        remove_tree(top)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert not top.exists()


def test_a_job_users_removal_changes_the_mode_only_of_its_own_directories(
    temp_root: Path, outside: Path
) -> None:
    """A directory the job left unreadable and unwritable is opened through a descriptor
    and its mode changed there (the job user's pass cannot remove it otherwise); a link to
    a directory outside is removed, not followed."""
    assert JOB_USER is not None
    top = job_tree(temp_root)
    (top / "locked" / "out").symlink_to(outside)
    os.lchown(top / "locked" / "out", JOB_USER.uid, JOB_USER.gid)
    (top / "locked").chmod(0)
    before = owned_entries(outside)
    pid = os.fork()
    if pid == 0:  # the job user's pass alone, not root's after it
        code = 1
        try:
            os.setgroups([])
            os.setgid(JOB_USER.gid)
            os.setuid(JOB_USER.uid)
            code = 0 if not removal._remove(top) else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert not top.exists()
    assert owned_entries(outside) == before
