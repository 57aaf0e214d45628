"""Starting an attempt's command in the supervisor (supervisor.py): the steps between its
fork and its exec that isolate it (isolation.py decides them), taken the cheapest way the
machine allows.

- **Nothing to do** (an agent that is not root, with no cgroup and no limits):
  `subprocess.Popen` with no pre-exec step, which CPython starts with vfork.
- **Born in its cgroup v2** (the default as root): clone3 with CLONE_INTO_CGROUP, so the
  command is in its cgroup from its first instruction rather than moved there by a write
  to `cgroup.procs`. That write takes the kernel's cgroup_threadgroup_rwsem for writing and
  waits out an RCU grace period: 11 ms at the p50 on a 2-core machine under load, most of
  what isolation added to an attempt's start. The child, a copy of the supervisor (one
  thread, so nothing is held by another), sets its rlimits, drops to the job user and
  execs, then says nothing (its error pipe closes at the exec) or why it could not.
- **Otherwise** (cgroup v1 limits to join, no clone3, an older kernel, more than one
  thread): `subprocess.Popen` with the steps as its pre-exec function, as before.

Either way the command runs in a session of its own, with stdin /dev/null, its output on
two pipes, the working directory and environment given, and no other descriptor; or, for a
session (session_process.py), with the three descriptors it is given (STDIO), and the
terminal among them as its controlling terminal (TTY).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import logging
import os
import resource
import signal
import subprocess
import termios
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, NoReturn, Protocol

from oz0_node.jobs import procfs
from oz0_node.jobs.job_user import JobUser

log = logging.getLogger(__name__)

SYS_CLONE3 = 435  # the same number on every architecture Linux added it to
CLONE_INTO_CGROUP = 0x200000000
# Errors of clone3 that mean "not here" (an older kernel, a seccomp filter, a cgroup it
# cannot be born in): the pre-exec path is taken instead, for good.
NOT_HERE = (errno.ENOSYS, errno.EPERM, errno.EINVAL, errno.E2BIG, errno.EOPNOTSUPP, errno.EBUSY)
# The child's error, on its pipe: which stage failed, and the errno.
STEPS, EXEC = b"steps", b"exec"


# Signals whose disposition a process may set (all but SIGKILL and SIGSTOP).
_RESETTABLE = tuple(sorted(signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}))
# Those the interpreter ignores on purpose; Popen's child and the clone3 child restore them.
_INTERPRETER_IGNORES = frozenset({signal.SIGPIPE, signal.SIGXFSZ})


def all_signals_default() -> None:
    """Every signal as its default, none blocked: what a command starts with, in the
    clone3 child and in Popen's pre-exec step alike (plain system calls, nothing computed
    after the fork)."""
    for sig in _RESETTABLE:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_SETMASK, ())


def unignore_inherited() -> None:
    """Give every signal this process inherited ignored its default again (a shell's `&`
    ignores SIGINT and SIGQUIT, nohup SIGHUP): an ignored signal survives fork and exec, so
    each command started from here would begin ignoring it. For the supervisor, whose
    commands may start through Popen with no pre-exec step, which restores only what the
    interpreter ignores."""
    for sig in _RESETTABLE:
        if sig not in _INTERPRETER_IGNORES and signal.getsignal(sig) == signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)


@dataclass(frozen=True)
class ChildSteps:
    """What the command's process does before its exec, in this order: be in CGROUP (a v2
    directory: born in it, or joined), join the other cgroups (JOIN: cgroup.procs files,
    v1), its own /tmp (PRIVATE: private_tmp.py, while still root and in its working
    directory), set the hard RLIMITS, then drop to USER."""

    cgroup: Path | None = None
    join: tuple[bytes, ...] = ()
    private: Callable[[], None] | None = None
    rlimits: tuple[tuple[int, int], ...] = ()
    user: JobUser | None = None

    @property
    def none(self) -> bool:
        return (
            self.cgroup is None
            and not self.join
            and self.private is None
            and not self.rlimits
            and self.user is None
        )

    def preexec(self) -> Callable[[], None]:
        """The steps as Popen's pre-exec function.

        It runs between fork and exec, possibly in a copy of a process with several threads
        (another may have held a lock at the fork), so it uses only values computed before
        (bytes, ints) and plain system calls, no logging and nothing that allocates much.
        CPython applies Popen's user=/group= before preexec_fn, so those are not used: the
        cgroup must be joined while still root."""
        procs = [os.fsencode(self.cgroup / "cgroup.procs")] if self.cgroup is not None else []
        procs += self.join
        private, rlimits, user, o_wronly = self.private, self.rlimits, self.user, os.O_WRONLY

        def preexec() -> None:
            # As the clone3 child does (Popen restores only what the interpreter ignores).
            all_signals_default()
            for path in procs:
                fd = os.open(path, o_wronly)
                try:
                    os.write(fd, b"0")
                finally:
                    os.close(fd)
            if private is not None:
                private()
            for which, value in rlimits:
                resource.setrlimit(which, (value, value))
            if user is not None:
                os.setgroups(list(user.groups))
                os.setgid(user.gid)
                os.setuid(user.uid)

        return preexec


class Command(Protocol):
    """The started command, as the supervisor follows it (subprocess.Popen's own names)."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | None

    def poll(self) -> int | None: ...


def spawn(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    steps: ChildSteps,
    stdio: tuple[int, int, int] | None = None,
    tty: bool = False,
) -> Command:
    """Start ARGV with STEPS (the module's docstring): its stdin, stdout and stderr STDIO
    (then it has no pipes here), else /dev/null and two pipes; TTY: its stdin is a terminal
    that becomes its controlling terminal. OSError when it cannot be run (not found:
    FileNotFoundError), subprocess.SubprocessError when a step failed."""
    if steps.none and not tty:
        return _popen(argv, cwd, env, None, stdio)
    if steps.cgroup is not None and not steps.join and _Clone3.usable():
        started = _Clone3.spawn(argv, cwd, env, steps, stdio, tty)
        if started is not None:
            return started
    preexec = steps.preexec()
    if tty:
        # Only ever in a supervisor (one thread): setsid is done (start_new_session), so
        # the terminal on stdin becomes the session's controlling terminal.
        def preexec_tty() -> None:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
            preexec()

        return _popen(argv, cwd, env, preexec_tty, stdio)
    return _popen(argv, cwd, env, preexec, stdio)


def _popen(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str],
    preexec: Callable[[], None] | None,
    stdio: tuple[int, int, int] | None = None,
) -> subprocess.Popen[bytes]:
    stdin, stdout, stderr = stdio or (subprocess.DEVNULL, subprocess.PIPE, subprocess.PIPE)
    return subprocess.Popen(
        list(argv),
        stdin=stdin,
        stdout=stdout,
        stderr=stderr,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        preexec_fn=preexec,
    )


class _CloneArgs(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "flags", "pidfd", "child_tid", "parent_tid", "exit_signal", "stack",
            "stack_size", "tls", "set_tid", "set_tid_size", "cgroup",
        )
    ]  # fmt: skip


class _Clone3:
    """clone3 with CLONE_INTO_CGROUP, while it works here (one failure that says it cannot
    turns it off for this process's life)."""

    works = True
    _syscall: Callable[..., int] | None = None

    @classmethod
    def usable(cls) -> bool:
        return cls.works and os.uname().sysname == "Linux" and procfs.one_thread()

    @classmethod
    def spawn(
        cls,
        argv: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        steps: ChildSteps,
        stdio: tuple[int, int, int] | None = None,
        tty: bool = False,
    ) -> Started | None:
        """ARGV started in STEPS' cgroup (its stdin, stdout and stderr STDIO, else
        /dev/null and two pipes; TTY: stdin its controlling terminal); None when clone3
        cannot do it here."""
        assert steps.cgroup is not None
        if cls._syscall is None:
            # PyDLL: the interpreter's lock stays held across the call, so the child
            # carries on exactly where the parent does.
            libc = ctypes.PyDLL(None, use_errno=True)
            libc.syscall.restype = ctypes.c_long
            cls._syscall = libc.syscall
        # Everything the child needs, made here: the child only makes system calls.
        program = os.fsencode(argv[0])
        candidates = (
            [program]
            if b"/" in program
            else [os.fsencode(d) + b"/" + program for d in os.get_exec_path(dict(env))]
        )
        args = [os.fsencode(a) for a in argv]
        environ = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
        workdir = os.fsencode(cwd)
        # This process's bound, before the child lowers its own (RLIMIT_NOFILE).
        fd_bound = os.sysconf("SC_OPEN_MAX")
        cgroup = os.open(steps.cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        fds: list[int] = [cgroup]
        try:
            if stdio is None:
                stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                fds.append(stdin)
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                fds += [out_r, out_w]
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                fds += [err_r, err_w]
                given = (stdin, out_w, err_w)
            else:
                given = stdio  # the caller's: not closed here
            fail_r, fail_w = os.pipe2(os.O_CLOEXEC)
            fds += [fail_r, fail_w]
            clone = _CloneArgs(flags=CLONE_INTO_CGROUP, exit_signal=signal.SIGCHLD, cgroup=cgroup)
            pid = cls._syscall(SYS_CLONE3, ctypes.byref(clone), ctypes.sizeof(clone))
            if pid == 0:
                _child(
                    fail_w, given, workdir, steps, candidates, args, environ, fd_bound, tty,
                )  # fmt: skip
            if pid < 0:
                code = ctypes.get_errno()
                if code in NOT_HERE:
                    cls.works = False
                    log.info(
                        "clone3 into a cgroup: %s; commands join it instead", os.strerror(code)
                    )
                    return None
                raise OSError(code, os.strerror(code), "clone3")
            for fd in (*(given if stdio is None else ()), fail_w):
                os.close(fd)
                fds.remove(fd)
            failed = _read_all(fail_r)
            if failed:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
                _raise(failed, argv[0])
            if stdio is not None:
                return Started(pid, None, None)
            started = Started(pid, os.fdopen(out_r, "rb"), os.fdopen(err_r, "rb"))
            fds.remove(out_r)
            fds.remove(err_r)
            return started
        finally:
            for fd in fds:
                os.close(fd)


def _child(
    fail: int,
    stdio: tuple[int, int, int],
    workdir: bytes,
    steps: ChildSteps,
    candidates: list[bytes],
    args: list[bytes],
    environ: dict[bytes, bytes],
    fd_bound: int,
    tty: bool = False,
) -> NoReturn:
    """The command's process between clone3 and exec; it never returns. Its errors go to
    FAIL as STAGE:ERRNO."""
    stage = STEPS
    try:
        for fd, number in zip(stdio, (0, 1, 2), strict=True):
            os.dup2(fd, number)
        os.chdir(workdir)
        # Every signal as the default, none blocked: an ignored one survives exec, and the
        # agent may have been started ignoring some (the interpreter ignores SIGPIPE and
        # SIGXFSZ; a shell's `&` ignores SIGINT and SIGQUIT, nohup SIGHUP).
        all_signals_default()
        os.setsid()
        if tty:
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)
        if steps.private is not None:
            steps.private()
        for which, value in steps.rlimits:
            resource.setrlimit(which, (value, value))
        if steps.user is not None:
            os.setgroups(list(steps.user.groups))
            os.setgid(steps.user.gid)
            os.setuid(steps.user.uid)
        # All but 0, 1, 2 and FAIL (close-on-exec: it tells the parent the exec happened).
        os.closerange(3, fail)
        os.closerange(fail + 1, fd_bound)
        stage = EXEC
        first: int | None = None
        last = errno.ENOENT
        for path in candidates:
            try:
                os.execve(path, args, environ)
            except OSError as e:
                # As CPython's own child: the first error that is not "no such file".
                if first is None and e.errno not in (errno.ENOENT, errno.ENOTDIR):
                    first = e.errno
                last = e.errno or last
        code = first if first is not None else last
    except OSError as e:
        code = e.errno or 0
    except BaseException:
        code = 0
    with contextlib.suppress(BaseException):
        os.write(fail, stage + b":" + str(code).encode())
    os._exit(255)


def _raise(failed: bytes, program: str) -> NoReturn:
    stage, _, number = failed.partition(b":")
    code = int(number) if number.isdigit() else 0
    if stage == EXEC and code:
        raise OSError(code, os.strerror(code), program)
    raise subprocess.SubprocessError(
        f"a step before its exec failed: {os.strerror(code) if code else 'unknown'}"
    )


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 256):
        chunks.append(chunk)
    return b"".join(chunks)


class Started:
    """A command started by clone3: what the supervisor asks of a Popen."""

    def __init__(self, pid: int, stdout: IO[bytes] | None, stderr: IO[bytes] | None) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = stdout
        self.stderr: IO[bytes] | None = stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                # Reaped by someone else: as Popen, taken as 0.
                self.returncode = 0
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode
