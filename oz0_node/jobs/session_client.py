"""The agent's handle on its sessions' supervisors (session_process.py; the messages:
session_handover.py).

`launch` starts one, forked by the agent's launcher (launcher.py) or, when there is none,
started as a fresh interpreter (`python -c BOOT`, which CPython starts without running any
Python between fork and exec): never forked by the agent. It makes the session's directory
and takes its lock before the supervisor exists and hands it down, as supervisor_client
does for an attempt, then returns the supervisor's answer: the session's descriptors, or
why it did not start. Blocking: the agent calls it in a worker thread.

`end_left(data_dir)`, at the agent's start: sessions are the agent's, so whatever a previous
agent process left of one (a supervisor still ending it, or one killed before it could) is
ended and its directory removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import select
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from oz0_node.jobs.attempt_files import LOCK_FILE, LOG_FILE
from oz0_node.jobs.isolation import Isolation
from oz0_node.jobs.launcher import (
    FORK_WITHIN,
    FORKED,
    SESSION_REQUEST,
    Launcher,
    supervisor_env,
)
from oz0_node.jobs.session_handover import (
    MAX_MESSAGE,
    SessionSpec,
    decode,
    handover,
    sessions_root,
)
from oz0_node.jobs.session_process import BOOT
from oz0_node.jobs.supervisor_client import START_WITHIN, Supervised

log = logging.getLogger(__name__)

# How long a supervisor left by a previous agent has to end its session when asked.
LEFT_WITHIN = 5.0


class SessionNotStarted(Exception):
    """The session did not start; the text is the one line the person gets."""


@dataclass
class Started:
    """A session's supervisor, once it has started the command."""

    supervisor: socket.socket  # the agent's end of the supervisor's socket (non-blocking)
    user: str | None  # whom it runs as, as the node says it
    fds: dict[str, int] = field(default_factory=dict)  # "pty", or "stdout", "stderr", "stdin"
    dir: Path | None = None

    def close_fds(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


def launch(
    data_dir: Path, spec: SessionSpec, isolation: Isolation, launcher: Launcher | None
) -> Started:
    """Start SPEC's supervisor and return once it has started the command;
    SessionNotStarted with the reason when it did not."""
    root = sessions_root(data_dir)
    root.mkdir(mode=0o700, exist_ok=True)
    directory = root / spec.session
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        raise SessionNotStarted(f"session {spec.session} runs here already") from None
    except OSError as e:
        raise SessionNotStarted(f"cannot make its directory: {e.strerror or e}") from None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    lock = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        handed = handover(spec, isolation, directory, lock)
        logs = os.open(
            directory / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600
        )
        try:
            started = False
            if launcher is not None:
                started = _through_launcher(launcher, handed, theirs, ours, logs, lock)
            if not started:
                _through_interpreter(handed, theirs, logs, lock)
        finally:
            os.close(logs)
            theirs.close()  # the supervisor's now: its end (or exit) is this side's EOF
    except BaseException:
        ours.close()
        raise
    finally:
        os.close(lock)
    try:
        return _answer(ours, directory)
    except BaseException:
        ours.close()
        raise


def _through_launcher(
    launcher: Launcher,
    handed: bytes,
    theirs: socket.socket,
    ours: socket.socket,
    logs: int,
    lock: int,
) -> bool:
    """HANDED to a supervisor the launcher forks; whether it forked one (else nothing was
    started: the caller starts it otherwise)."""
    spec_r, spec_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            sent = launcher.send((spec_r, theirs.fileno(), logs, lock), SESSION_REQUEST)
        finally:
            os.close(spec_r)
        if not sent:
            return False
        forked = _receive(ours, FORK_WITHIN)
        if forked is None or forked[0] != FORKED:
            if forked is None:
                launcher.lost()
            return False  # not forked, or too late: its first process finds no spec
        _write_all(spec_w, handed)
        return True
    finally:
        os.close(spec_w)


def _through_interpreter(handed: bytes, theirs: socket.socket, logs: int, lock: int) -> None:
    """HANDED to a supervisor started as a fresh interpreter."""
    process = subprocess.Popen(
        [sys.executable, "-P", "-c", BOOT],
        stdin=subprocess.PIPE,
        stdout=theirs.fileno(),
        stderr=logs,
        pass_fds=(lock,),
        start_new_session=True,
        cwd="/",
        env=supervisor_env(),
    )
    assert process.stdin is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(handed)
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    try:
        # Its first process exits as soon as it has forked the supervisor.
        process.wait(START_WITHIN)
    except subprocess.TimeoutExpired:
        log.warning("a session's supervisor's first process did not exit")


def _answer(ours: socket.socket, directory: Path) -> Started:
    """The supervisor's first word: started (with the session's descriptors) or refused."""
    got = _receive(ours, START_WITHIN)
    while got is not None and got[0] == FORKED:
        # A first process the launcher forked too late for its request (the fallback ran
        # meanwhile): it found no spec and exited.
        got = _receive(ours, START_WITHIN)
    if got is None:
        end_dir(directory)
        raise SessionNotStarted(f"its supervisor did not start it in {START_WITHIN:g} s")
    data, fds = got
    message = decode(data)
    if "started" in message and isinstance(message.get("fds"), list):
        names = [str(n) for n in message["fds"]]
        if len(names) == len(fds):
            ours.setblocking(False)
            for fd in fds:
                os.set_blocking(fd, False)  # read and written in the agent's event loop
            user = message["started"]
            named = dict(zip(names, fds, strict=True))
            return Started(ours, user if isinstance(user, str) else None, named, directory)
    for fd in fds:
        os.close(fd)
    if data == b"":
        # It died before it said anything: what it made is ended from its record.
        end_dir(directory)
        raise SessionNotStarted(f"its supervisor ended ({directory / LOG_FILE})")
    raise SessionNotStarted(str(message.get("refused") or "its supervisor said nothing clear"))


def _receive(sock: socket.socket, within: float) -> tuple[bytes, list[int]] | None:
    """The next message on SOCK with its descriptors (b"" at its end); None when none came
    within WITHIN seconds."""
    deadline = time.monotonic() + within
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([sock], [], [], left)[0]:
            return None
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 4)
        except InterruptedError:
            continue
        except OSError:
            return b"", []
        return data, fds


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    with contextlib.suppress(BrokenPipeError):
        while view:
            view = view[os.write(fd, view) :]


def end_dir(directory: Path) -> None:
    """End what the session of DIRECTORY left: ask its supervisor to end it (at most
    LEFT_WITHIN, then SIGKILL), end what a dead one recorded, remove the directory."""
    if directory.is_dir():
        supervised = Supervised(directory.name, 1, directory)
        supervised.end_now(LEFT_WITHIN)
        supervised.remove()


def end_left(data_dir: Path) -> int:
    """At the agent's start: end every session a previous agent process left; how many."""
    try:
        found = sorted(sessions_root(data_dir).iterdir())
    except FileNotFoundError:
        return 0
    for directory in found:
        if directory.is_dir() and not directory.is_symlink():
            log.info("session %s of a previous agent process: ending it", directory.name)
            end_dir(directory)
    return len(found)
