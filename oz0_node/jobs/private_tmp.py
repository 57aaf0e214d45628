"""An attempt's own /tmp and /var/tmp, as systemd's `PrivateTmp=`: the command starts in a
mount namespace of its own (unshare CLONE_NEWNS, every mount made private so nothing
propagates back to the machine) with a fresh tmpfs (mode 1777) on /tmp and on /var/tmp, and
its working directory (which lies in the machine's /tmp) bound at the same path inside, so
HOME, TMPDIR and the working directory stay as they were. What it writes there is gone with
its last process (the namespace and its tmpfs go with it): nothing to sweep, nothing another
attempt sees. Given only to attempts that run as a UID of their own (attempt_uids.py): an
account's jobs may share /tmp with its other processes, and root's may mount things.

Where the kernel refuses (no CAP_SYS_ADMIN, as in most containers; no mount namespaces) the
attempt runs with the machine's /tmp, and says so (`outcome`). Set up in the command's
process between fork and exec, while still root (spawn.py's ChildSteps): nothing there but
system calls on values made before the fork.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

CLONE_NEWNS = 0x00020000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
PRIVATE_DIRS = (Path("/tmp"), Path("/var/tmp"))
HELD = "mount namespace"
NOT_TRIED = "not applied: the command did not start"


_LIBC: list[ctypes.CDLL] = []


def _libc() -> ctypes.CDLL:
    """The C library, its mount's argument types set (once per process)."""
    if not _LIBC:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        _LIBC.append(libc)
    return _LIBC[0]


class PrivateTmp:
    """The steps for one attempt whose working directory is WORKDIR (made before the fork);
    called in the child; `outcome` (in the parent, once the command has started) says
    whether they held."""

    def __init__(self, workdir: Path, dirs: tuple[Path, ...] = PRIVATE_DIRS) -> None:
        libc = _libc()
        self._unshare = libc.unshare
        self._mount = libc.mount
        self._dirs = [os.fsencode(d) for d in dirs if d.is_dir() and not d.is_symlink()]
        # The directories to make in the private one, down to WORKDIR, if it is in one.
        self._path: list[bytes] = []
        for private in dirs:
            if workdir.is_relative_to(private) and workdir != private:
                parts = workdir.relative_to(private).parts
                self._path = [
                    os.fsencode(private.joinpath(*parts[: n + 1])) for n in range(len(parts))
                ]
        self._read, self._write = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)

    def _fail(self, step: bytes) -> None:
        os.write(self._write, b"-" + step + b" " + str(ctypes.get_errno()).encode())

    def __call__(self) -> None:
        """In the child: the namespace and its mounts. A refused unshare leaves the command
        as it was (said in the pipe); a failure after it is raised (the command does not
        start half isolated)."""
        if self._unshare(CLONE_NEWNS) != 0:
            self._fail(b"unshare")
            return
        if self._mount(None, b"/", None, MS_REC | MS_PRIVATE, None) != 0:
            self._fail(b"private")
            raise OSError(ctypes.get_errno(), "cannot make the mounts private")
        for private in self._dirs:
            options = b"mode=1777"
            if self._mount(b"tmpfs", private, b"tmpfs", MS_NOSUID | MS_NODEV, options) != 0:
                self._fail(b"tmpfs")
                raise OSError(ctypes.get_errno(), "cannot mount a tmpfs", private)
        if self._path:
            for inside in self._path:
                os.mkdir(inside, 0o755)  # noqa: PTH102 (bytes, made before the fork)
            # The working directory (already the process's): at its own path again.
            workdir = self._path[-1]
            if self._mount(b"/proc/self/cwd", workdir, None, MS_BIND, None) != 0:
                self._fail(b"bind")
                raise OSError(ctypes.get_errno(), "cannot bind the working directory", workdir)
            os.chdir(workdir)
        os.write(self._write, b"+")

    def outcome(self) -> str:
        """HELD, or `not applied: ...` with why (once; closes the pipe): the attempt's
        `applied` says it as `private_tmp`."""
        try:
            said = os.read(self._read, 256)
        except BlockingIOError:
            said = b""
        finally:
            os.close(self._read)
            os.close(self._write)
        if said == b"+":
            return HELD
        if not said.startswith(b"-"):
            return NOT_TRIED
        step, _, number = said[1:].decode("ascii", "replace").partition(" ")
        why = os.strerror(int(number)) if number.isdigit() else number
        return f"not applied: {step}: {why}"
