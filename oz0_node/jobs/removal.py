"""Removing a directory a job could write to (its working directory, what a crash left of
it) without following a link the job planted and without widening any mode outside it.

A job owns its working directory and everything in it, and may swap any entry for a
symbolic link at any moment, even while the removal runs (another attempt of the same user
can). So nothing here goes by path below the directory's parent: each directory is opened
relative to its parent's descriptor with O_NOFOLLOW (a link is never opened, only
unlinked), entries are unlinked and directories removed relative to the descriptor of the
directory that holds them (`unlink(name, dir_fd=…)`, `rmdir(name, dir_fd=…)`), and a mode is
changed only on a directory held open that way, inside the tree, when it cannot be emptied
otherwise (a job may leave its directories unwritable): never the parent, never through a
name. A directory on another filesystem (a mount point) is not entered.

Where it can, the removal runs first as the job's own user (`remove_tree(..., as_user=)`: a
forked child that drops to its uid and gid), so it can do no more than the job itself
could; what that leaves (nothing, usually) is removed by the caller's own, descriptor-based
pass, which is correct on its own.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import signal
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from oz0_node.jobs import procfs
from oz0_node.jobs.job_user import JobUser

log = logging.getLogger(__name__)

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A directory that cannot be read or searched, opened only to change its mode.
PATH_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# How many directories are held open at once going down (two descriptors each); deeper
# ones are moved up into the top directory and emptied from there.
MAX_DEPTH = 100
MOVED_PREFIX = ".oz0-removed-"
# How long the job user's pass may take before the caller's own carries on without it.
AS_USER_WITHIN = 60.0
# How many times a directory that something refilled meanwhile is emptied again.
REFILLED_TRIES = 3

Entries = Iterator[tuple[str, bool]]


def remove_tree(path: Path, *, as_user: JobUser | None = None) -> None:
    """Delete PATH and all in it, never following a symbolic link (PATH itself a link: the
    link is removed); a failure is logged. AS_USER: first as that user (the module's
    docstring), when this process is root and has one thread (a fork of a process with more
    could deadlock in the child)."""
    if as_user is not None and as_user.uid != 0 and os.geteuid() == 0 and procfs.one_thread():
        _remove_as(as_user, path)
    failed = _remove(path)
    if failed:
        e = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        log.warning("cannot remove %s: %s (%s)%s", path, e.strerror or e, e.filename, more)


def _remove(path: Path) -> list[OSError]:
    """Remove PATH; what failed."""
    try:
        # The parent is the caller's (the system's temporary directory, the data directory):
        # trusted, and never changed.
        parent = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileNotFoundError:
        return []
    except OSError as e:
        return [e]
    try:
        removal = _Removal(str(path))
        top = removal.open_dir(parent, path.name, inside=False)
        if top is None:
            return removal.failed
        try:
            removal.top, removal.dev = top, os.fstat(top).st_dev
            for _ in range(REFILLED_TRIES):
                removal.empty()
                if removal.remove_dir(parent, path.name, inside=False):
                    break
            else:
                removal.fail(OSError(errno.ENOTEMPTY, "refilled while it was removed"), "")
        finally:
            os.close(top)
        return removal.failed
    finally:
        os.close(parent)


class _Removal:
    """One tree's removal, through descriptors (the module's docstring)."""

    def __init__(self, shown: str) -> None:
        self.shown = shown  # the tree's path, for messages only: never opened
        self.top = -1
        self.dev = -1
        self.failed: list[OSError] = []
        self.moved: list[str] = []  # directories moved up into the top one
        self.counter = 0

    def fail(self, e: OSError, name: str) -> None:
        e.filename = f"{self.shown}/…/{name}" if name else self.shown
        self.failed.append(e)

    def empty(self) -> None:
        """Remove all that is in the top directory."""
        # Each level: its descriptor, its entries still to look at, its name one level up.
        stack: list[tuple[int, Entries, str]] = [(self.top, self._top_entries(), "")]
        try:
            while stack:
                fd, entries, _ = stack[-1]
                entry = next(entries, None)
                if entry is None:
                    _, _, name = stack.pop()
                    if stack:
                        os.close(fd)
                        # Left for the top's next pass if something refilled it meanwhile.
                        self.remove_dir(stack[-1][0], name, inside=True)
                    continue
                name, is_dir = entry
                if not is_dir and self.unlink(fd, name):
                    continue
                child = self.open_dir(fd, name, inside=True)
                if child is None:
                    continue
                if len(stack) < MAX_DEPTH:
                    stack.append((child, self._entries(child, name), name))
                else:
                    os.close(child)
                    self._move_up(fd, name)
        finally:
            for fd, _, _ in stack[1:]:
                os.close(fd)

    def _top_entries(self) -> Entries:
        yield from self._entries(self.top, "")
        while self.moved:
            yield self.moved.pop(), True

    def _entries(self, fd: int, name: str) -> Entries:
        try:
            with os.scandir(fd) as it:
                for entry in it:
                    try:
                        is_dir = entry.is_dir(follow_symlinks=False)
                    except OSError:
                        is_dir = True  # unknown: opened as one, unlinked if it is not
                    yield entry.name, is_dir
        except OSError as e:
            self.fail(e, name)

    def unlink(self, fd: int, name: str, *, inside: bool = True) -> bool:
        """Unlink NAME in FD (a link: the link itself); False when it is a directory.
        INSIDE: FD is in the tree (its mode may be changed to remove from it)."""
        for _ in range(2):
            try:
                os.unlink(name, dir_fd=fd)
                return True
            except FileNotFoundError:
                return True
            except IsADirectoryError:
                return False
            except OSError as e:
                if not (e.errno == errno.EACCES and inside and self._writable(fd)):
                    self.fail(e, name)
                    return True
        return True

    def open_dir(self, fd: int, name: str, *, inside: bool) -> int | None:
        """NAME in FD opened as a directory, without following a link, if it is one on the
        tree's filesystem; else unlinked (a link, a file) or left (another filesystem), and
        None. INSIDE: FD is in the tree (its mode may be changed to remove from it)."""
        child: int | None
        try:
            child = os.open(name, DIR_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            return None
        except PermissionError:
            child = self._open_unreadable(fd, name, inside=inside)
            if child is None:
                return None
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                self.unlink(fd, name, inside=inside)
            else:
                self.fail(e, name)
            return None
        if self.dev != -1 and os.fstat(child).st_dev != self.dev:
            os.close(child)
            self.fail(OSError(errno.EXDEV, "another filesystem: not entered"), name)
            return None
        return child

    def _open_unreadable(self, fd: int, name: str, *, inside: bool) -> int | None:
        """A directory of the tree that this user may not read or search (its job left it
        so): its mode is changed through a descriptor (O_PATH, never a link), then it is
        opened through that same descriptor."""
        try:
            handle = os.open(name, PATH_FLAGS, dir_fd=fd)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                self.unlink(fd, name, inside=inside)
            elif e.errno != errno.ENOENT:
                self.fail(e, name)
            return None
        try:
            # /proc/self/fd/N is the very directory HANDLE holds, not a name looked up again.
            held = f"/proc/self/fd/{handle}"
            mode = os.fstat(handle).st_mode
            Path(held).chmod(stat.S_IMODE(mode) | stat.S_IRWXU)
            return os.open(held, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as e:
            self.fail(e, name)
            return None
        finally:
            os.close(handle)

    def _writable(self, fd: int) -> bool:
        """Give this user write and search on FD's directory (in the tree, held open), when
        it lacks them; whether it changed anything."""
        try:
            mode = stat.S_IMODE(os.fstat(fd).st_mode)
            if mode & stat.S_IRWXU == stat.S_IRWXU:
                return False
            os.fchmod(fd, mode | stat.S_IRWXU)
            return True
        except OSError:
            return False

    def remove_dir(self, fd: int, name: str, *, inside: bool) -> bool:
        """rmdir NAME in FD (a link there now: ENOTDIR, nothing followed); whether it is gone.
        Refilled meanwhile (ENOTEMPTY): left for the top's next pass."""
        for _ in range(2):
            try:
                os.rmdir(name, dir_fd=fd)
                return True
            except FileNotFoundError:
                return True
            except OSError as e:
                if e.errno == errno.ENOTEMPTY:
                    return False
                if not (e.errno == errno.EACCES and inside and self._writable(fd)):
                    self.fail(e, name)
                    return False
        return False

    def _move_up(self, fd: int, name: str) -> None:
        """Move NAME (a directory MAX_DEPTH down) into the top directory: emptied from there,
        so that a chain of any depth holds at most MAX_DEPTH descriptors."""
        while True:
            self.counter += 1
            new = f"{MOVED_PREFIX}{self.counter}"
            try:
                os.rename(name, new, src_dir_fd=fd, dst_dir_fd=self.top)
            except FileExistsError:
                continue
            except OSError as e:
                if e.errno == errno.ENOTEMPTY:
                    continue
                self.fail(e, name)
                return
            self.moved.append(new)
            return


# --- as the job's user ------------------------------------------------------------------------


def _remove_as(user: JobUser, path: Path) -> None:
    """Remove PATH in a child that is USER (no supplementary groups), within AS_USER_WITHIN;
    what it could not remove is left for the caller's own pass, which logs it."""
    try:
        pid = os.fork()
    except OSError as e:
        log.info("cannot fork to remove %s as %s: %s", path, user.name, e.strerror or e)
        return
    if pid == 0:
        code = 1
        try:
            os.setgroups([])
            os.setgid(user.gid)
            os.setuid(user.uid)
            code = 0 if not _remove(path) else 2
        finally:
            os._exit(code)
    _wait(pid, AS_USER_WITHIN, path)


def _running(pid: int) -> bool:
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False


def _wait(pid: int, within: float, path: Path) -> None:
    pidfd = None
    with contextlib.suppress(OSError, AttributeError):
        pidfd = os.pidfd_open(pid)
    try:
        deadline = time.monotonic() + within
        while _running(pid):
            left = deadline - time.monotonic()
            if left <= 0:
                log.warning("removing %s as the job user took over %g s: stopped", path, within)
                os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                return
            if pidfd is not None:
                select.select([pidfd], [], [], left)
            else:
                time.sleep(min(left, 0.005))
    finally:
        if pidfd is not None:
            os.close(pidfd)
