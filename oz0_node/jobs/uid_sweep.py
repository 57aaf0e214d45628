"""What is left of a UID on the machine, found and removed: its processes (by /proc), its
System V IPC objects (/proc/sysvipc) and its files in the machine's shared writable places
(/tmp, /var/tmp, /dev/shm, /dev/mqueue, /run/lock). Run for an attempt's own UID once its
attempt has ended (attempt_uids.py; docs/manage-nodes.md, "What a job can reach"), and by
the agent's start to check that nothing on the machine uses the reserved range.

Files are walked and removed through directory descriptors, never through a path twice:
each directory is opened with O_NOFOLLOW relative to its parent's descriptor and checked to
be the one listed, entries are looked at with lstat (a link is an entry like any other,
never followed) and removed with unlinkat/rmdir relative to their directory. A walk stays
on the file system of the place it starts from and goes only where the UID could have gone:
a directory searchable by others, by the UID's group, or by an ACL (a directory another user
keeps closed holds nothing the UID made). A tree the UID owns goes whole, whoever owns what
is in it; deeper than MAX_DEPTH its directories are moved up (renamed into its top) rather
than opened deeper, so a job's deep tree costs no more descriptors than a shallow one.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import itertools
import logging
import os
import signal
import stat
import time
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path

from oz0_node.jobs import procfs

log = logging.getLogger(__name__)

# The machine's places every user may write in (each swept where it exists).
SHARED_PLACES = (
    Path("/tmp"),
    Path("/var/tmp"),
    Path("/dev/shm"),
    Path("/dev/mqueue"),
    Path("/run/lock"),
)
# What an attempt with its own /tmp and /var/tmp could reach of them.
PRIVATE_SWEPT = tuple(p for p in SHARED_PLACES if p not in (Path("/tmp"), Path("/var/tmp")))
# How long the processes of a UID are looked for and killed before what is left is said.
END_WITHIN = 2.0
KILL_EVERY = 0.01
# Directories opened at once below a tree's top while removing it (then moved up instead).
MAX_DEPTH = 32
# Entries one walk looks at; beyond it the walk stops and says so.
MAX_ENTRIES = 200_000
SYSVIPC = procfs.PROC / "sysvipc"
# The column holding each kind's ID in /proc/sysvipc/<kind>.
IPC_KINDS = {"shm": "shmid", "sem": "semid", "msg": "msqid"}
IPC_RMID = 0
ACL_ACCESS = "system.posix_acl_access"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

Match = Callable[[int], bool]


@dataclass
class Swept:
    """What one sweep of a UID removed, and what it could not."""

    processes: int = 0
    ipc: int = 0
    files: int = 0
    left: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.left

    def describe(self) -> str:
        """One line for the attempt's `applied`: `ended 1 process, removed 2 files`, or
        `nothing left`; and what was left, if anything."""
        done = [
            f"{what} {n} {one if n == 1 else many}"
            for what, n, one, many in (
                ("ended", self.processes, "process", "processes"),
                ("removed", self.ipc, "IPC object", "IPC objects"),
                ("removed", self.files, "file", "files"),
            )
            if n
        ]
        text = ", ".join(done) if done else "nothing left"
        if self.left:
            text += "; LEFT: " + "; ".join(self.left)
        return text


# --- processes --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProcessUids:
    pid: int
    uids: tuple[int, ...]  # real, effective, saved, file system
    zombie: bool  # gone but for its parent's wait (a zombie leader with threads is not)
    ppid: int


def _field(text: bytes, name: bytes, default: bytes) -> bytes:
    at = text.find(b"\n" + name + b":")
    if at < 0:
        return default
    start = at + len(name) + 2
    end = text.find(b"\n", start)
    return text[start : end if end >= 0 else len(text)].strip()


def parse_status(pid: int, text: bytes) -> ProcessUids | None:
    """The UIDs, state and parent in TEXT, a /proc/PID/status; None if it has none. Only
    the few fields wanted are looked for (a scan reads every process's)."""
    try:
        uids = tuple(int(u) for u in _field(text, b"Uid", b"").split())
        ppid = int(_field(text, b"PPid", b"0"))
        threads = int(_field(text, b"Threads", b"1"))
    except ValueError:
        return None
    if not uids:
        return None
    state = _field(text, b"State", b"?")[:1]
    return ProcessUids(pid, uids, state in (b"Z", b"X") and threads <= 1, ppid)


_PROC = os.fsencode(procfs.PROC)


def read_status(pid: int) -> ProcessUids | None:
    # os.open and one read: half the cost of open() on a scan of every process.
    try:
        fd = os.open(b"%s/%d/status" % (_PROC, pid), os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        text = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    return parse_status(pid, text)


def processes(match: Match) -> list[ProcessUids]:
    """Every process one of whose UIDs MATCH says is wanted (zombies too)."""
    found = []
    try:
        names = os.listdir(procfs.PROC)  # noqa: PTH208 (names only)
    except OSError:
        return []
    me = os.getpid()
    for name in names:
        if not name.isdigit() or int(name) == me:
            continue
        status = read_status(int(name))
        if status is not None and any(match(uid) for uid in status.uids):
            found.append(status)
    return found


def end_processes(uid: int, within: float = END_WITHIN) -> tuple[int, list[int]]:
    """SIGKILL every process of UID (any of its four UIDs), again until none is left or
    WITHIN seconds have passed; reap those that came to this process. How many were
    killed, and the PIDs still there."""
    killed: set[int] = set()
    deadline = time.monotonic() + within
    me = os.getpid()
    while True:
        live = []
        for found in processes(lambda u: u == uid):
            if found.zombie:
                if found.ppid == me:  # adopted (a subreaper's): reaped here
                    with contextlib.suppress(ChildProcessError):
                        os.waitpid(found.pid, os.WNOHANG)
                continue
            live.append(found.pid)
        if not live or time.monotonic() >= deadline:
            return len(killed), live
        for pid in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
        time.sleep(KILL_EVERY)


# --- System V IPC -----------------------------------------------------------------------


@dataclass(frozen=True)
class IpcObject:
    kind: str  # shm, sem or msg
    id: int
    uid: int  # its owner's
    cuid: int  # its creator's


def parse_sysvipc(kind: str, text: str) -> list[IpcObject]:
    """The objects TEXT (a /proc/sysvipc/KIND) lists, by its header's column names."""
    lines = text.splitlines()
    if not lines:
        return []
    header = lines[0].split()
    try:
        at_id, at_uid, at_cuid = (header.index(n) for n in (IPC_KINDS[kind], "uid", "cuid"))
    except ValueError:
        return []
    found = []
    for line in lines[1:]:
        words = line.split()
        with contextlib.suppress(IndexError, ValueError):
            found.append(
                IpcObject(kind, int(words[at_id]), int(words[at_uid]), int(words[at_cuid]))
            )
    return found


def ipc_objects(match: Match) -> list[IpcObject]:
    """System V IPC objects of this IPC namespace owned or made by a UID MATCH wants."""
    found = []
    for kind in IPC_KINDS:
        try:
            text = (SYSVIPC / kind).read_text()
        except OSError:
            continue
        found += [o for o in parse_sysvipc(kind, text) if match(o.uid) or match(o.cuid)]
    return found


def _remove_ipc_object(obj: IpcObject) -> int:
    """0, or the errno of IPC_RMID on OBJ (a shared memory segment still attached goes once
    its last process detaches: all of them have been killed)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if obj.kind == "shm":
        done = libc.shmctl(obj.id, IPC_RMID, None)
    elif obj.kind == "sem":
        done = libc.semctl(obj.id, 0, IPC_RMID)
    else:
        done = libc.msgctl(obj.id, IPC_RMID, None)
    return 0 if done == 0 else ctypes.get_errno()


def remove_ipc(uid: int) -> tuple[int, list[str]]:
    """Remove UID's System V IPC objects; how many, and what could not be removed."""
    removed, left = 0, []
    for obj in ipc_objects(lambda u: u == uid):
        failed = _remove_ipc_object(obj)
        if failed in (0, errno.EINVAL, errno.EIDRM):  # gone meanwhile counts as gone
            removed += failed == 0
        else:
            left.append(f"System V {obj.kind} {obj.id}: {os.strerror(failed)}")
    return removed, left


# --- files ------------------------------------------------------------------------------


class _Budget:
    def __init__(self, entries: int) -> None:
        self.left = entries

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _open_dir(parent: int, name: str, seen: os.stat_result) -> int | None:
    """NAME in PARENT as a directory descriptor, if it is still the directory SEEN."""
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
    except OSError:
        return None
    now = os.fstat(fd)
    if (now.st_dev, now.st_ino) != (seen.st_dev, seen.st_ino):
        os.close(fd)
        return None
    return fd


def _enterable(fd: int, st: os.stat_result, match: Match) -> bool:
    """Whether a UID MATCH wants could have searched this directory (fd: it, opened)."""
    if st.st_mode & stat.S_IXOTH or (match(st.st_gid) and st.st_mode & stat.S_IXGRP):
        return True
    try:
        os.getxattr(fd, ACL_ACCESS)
    except OSError:
        return False
    return True  # an ACL may name the UID: looked into


def owned_entries(
    top: Path, match: Match, budget: _Budget | None = None
) -> Generator[tuple[int, Path, os.stat_result]]:
    """(directory descriptor, path, lstat) of each entry under TOP owned by a UID MATCH
    wants (not what is inside an owned directory), as the walk finds them: the descriptor
    is that of the entry's directory, open until the next is yielded (remove the entry
    then, by its name, or not at all). Stops when BUDGET runs out (`budget.left < 0`)."""
    budget = budget or _Budget(MAX_ENTRIES)
    try:
        root = os.open(top, _DIR_FLAGS)
    except OSError:
        return
    device = os.fstat(root).st_dev
    stack = [(root, top)]
    try:
        while stack:
            fd, where = stack.pop()
            try:
                with os.scandir(fd) as entries:
                    listed = list(entries)
                for entry in listed:
                    if not budget.take():
                        return
                    try:
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if match(st.st_uid):
                        yield fd, where / entry.name, st
                    elif stat.S_ISDIR(st.st_mode) and st.st_dev == device:
                        child = _open_dir(fd, entry.name, st)
                        if child is None:
                            continue
                        if _enterable(child, st, match):
                            stack.append((child, where / entry.name))
                        else:
                            os.close(child)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def first_owned(top: Path, match: Match) -> tuple[Path, int] | None:
    """The first entry under TOP a UID MATCH wants owns, and its owner; None if none."""
    with contextlib.closing(owned_entries(top, match)) as found:
        for _, path, st in found:
            return path, st.st_uid
    return None


def remove_tree_at(parent: int, name: str, seen: os.stat_result) -> tuple[int, list[str]]:
    """Remove NAME in directory PARENT (a file, a link, or a directory with all in it, the
    one SEEN), never following a link; how many entries went, and what could not."""
    if not stat.S_ISDIR(seen.st_mode):
        try:
            os.unlink(name, dir_fd=parent)
        except FileNotFoundError:
            return 0, []
        except OSError as e:
            return 0, [f"{name}: {e.strerror}"]
        return 1, []
    top = _open_dir(parent, name, seen)
    if top is None:
        return 0, [f"{name}: not the directory it was"]
    try:
        removed, left = _empty(top, top, name, 0, itertools.count())
    finally:
        os.close(top)
    try:
        os.rmdir(name, dir_fd=parent)
        removed += 1
    except OSError as e:
        left.append(f"{name}: {e.strerror}")
    return removed, left


def _empty(
    top: int, fd: int, where: str, depth: int, moved: itertools.count[int]
) -> tuple[int, list[str]]:
    """Remove all in directory FD (at WHERE, DEPTH below TOP); directories deeper than
    MAX_DEPTH are renamed into TOP first and emptied from there."""
    removed, left = 0, list[str]()
    while True:
        with os.scandir(fd) as entries:
            listed = [(e.name, e.stat(follow_symlinks=False)) for e in entries]
        if not listed:
            return removed, left
        progress = False
        for name, st in listed:
            if not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(name, dir_fd=fd)
                    removed += 1
                    progress = True
                except FileNotFoundError:
                    progress = True
                except OSError as e:
                    left.append(f"{where}/{name}: {e.strerror}")
                continue
            if depth + 1 >= MAX_DEPTH and fd != top:
                # Moved up rather than opened deeper: emptied again from TOP.
                with contextlib.suppress(OSError):
                    os.rename(name, f".oz0-swept-{next(moved)}", src_dir_fd=fd, dst_dir_fd=top)
                    progress = True
                continue
            child = _open_dir(fd, name, st)
            if child is None:
                left.append(f"{where}/{name}: not the directory it was")
                continue
            try:
                got, failed = _empty(top, child, f"{where}/{name}", depth + 1, moved)
            finally:
                os.close(child)
            removed += got
            left += failed
            try:
                os.rmdir(name, dir_fd=fd)
                removed += 1
                progress = True
            except OSError as e:
                if e.errno != errno.ENOTEMPTY:
                    left.append(f"{where}/{name}: {e.strerror}")
        if left or not progress:
            return removed, left


def remove_files(uid: int, places: tuple[Path, ...] = SHARED_PLACES) -> tuple[int, list[str]]:
    """Remove whatever UID owns in PLACES (see the module's docstring); how many entries
    went, and what could not."""
    removed, left = 0, []
    for place in places:
        budget = _Budget(MAX_ENTRIES)
        with contextlib.closing(owned_entries(place, lambda u: u == uid, budget)) as found:
            for fd, path, st in found:
                got, failed = remove_tree_at(fd, path.name, st)
                removed += got
                left += [f"{path.parent}/{what}" for what in failed]
        if budget.left < 0:
            left.append(f"{place}: more than {MAX_ENTRIES} entries, not all looked at")
    return removed, left


def sweep(
    uid: int,
    places: tuple[Path, ...] = SHARED_PLACES,
    *,
    ended: tuple[int, list[int]] | None = None,
) -> Swept:
    """End every process of UID, remove its System V IPC objects and its files in PLACES.
    ENDED: what `end_processes(uid)` has just said (none of UID's can start since). An
    attempt that had /tmp and /var/tmp of its own (private_tmp.py) could not reach the
    machine's: PLACES without them (`PRIVATE_SWEPT`) is enough, and spares a walk of the
    machine's /tmp."""
    swept = Swept()
    swept.processes, live = ended if ended is not None else end_processes(uid)
    if live:
        swept.left.append(f"process(es) {', '.join(map(str, live))} did not end")
    swept.ipc, failed = remove_ipc(uid)
    swept.left += failed
    swept.files, failed = remove_files(uid, places)
    swept.left += failed
    return swept
