"""A session's supervisor (docs/sessions.md): the process that sets a session up, starts its
command and ends it, so that the agent, which runs threads (Temporal's worker, the
websocket's), never forks for one. A fork in a process with threads copies locks other
threads may hold (the child can hang on one) and runs Python between fork and exec, which
CPython warns against; an attempt's supervisor is forked by the agent's launcher, a process
of one thread, for the same reason, and a session's is forked the same way
(session_client.launch; the messages: session_handover.py).

The supervisor opens the PTY (or the pipes) and starts the command, then hands the agent
the descriptors it reads and writes (SCM_RIGHTS) and keeps none of them: the agent relays
them to its edge as before, so a keystroke crosses no extra process, and the supervisor
has only the session's life to follow. Relaying through the supervisor instead would add a
hop and a second copy of every byte, for nothing the agent could not do with the
descriptors themselves.

It then waits for the command's exit (said to the agent: `exit`), a hang-up (SIGHUP to the
session's processes), or the end: asked by the agent, a SIGTERM, or the agent's end of the
socket closing (the agent gone, however: a session lives no longer than its agent). At the
end whatever is left of the session gets SIGHUP, then SIGKILL after HANGUP_GRACE; its place
is undone as an attempt's (its cgroup, its directory, its UID swept: isolation.py); then it
says `ended` and removes its own directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pwd
import selectors
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

from oz0_common.files import write_private
from oz0_node.jobs import procfs
from oz0_node.jobs.attempt_files import PID_FILE, TRACKING_FILE
from oz0_node.jobs.isolation import AttemptRecord, Isolation, Limits, Placement
from oz0_node.jobs.job_user import JobUser
from oz0_node.jobs.process import GONE_POLL
from oz0_node.jobs.removal import remove_tree
from oz0_node.jobs.session_handover import (
    MAX_MESSAGE,
    PIPE_FDS,
    PTY_FDS,
    STDIN_FD,
    SessionSpec,
    decode,
    encode,
    parse_handover,
)
from oz0_node.jobs.spawn import Command, spawn
from oz0_node.jobs.supervisor import BoundedLog, read_all
from oz0_node.jobs.tracking import PROCESS_GROUP, SCAN_EVERY, SUBREAPER, become_subreaper

log = logging.getLogger(__name__)

# After SIGHUP, how long a session's processes have before SIGKILL.
HANGUP_GRACE = 1.0
# After SIGKILL, how long they may take to be gone.
KILL_WITHIN = 5.0
BOOT = "from oz0_node.jobs.session_process import main; main()"


def main(lock: int | None = None) -> None:
    """The supervisor's process: forked by the launcher (which passes LOCK) or started as
    `python -c BOOT`, with the spec's pipe on stdin and the agent's socket on stdout."""
    handed = read_all(0)
    if not handed:
        return  # the agent gave up on this one before handing it anything
    raw = json.loads(handed)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    ending: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: ending.append(signum))
    # Not its launcher's child from now on (as an attempt's supervisor: supervisor.main).
    if os.fork() != 0:
        os._exit(0)
    spec, isolation, directory, handed_lock = parse_handover(raw)
    lock = handed_lock if lock is None else lock
    os.set_inheritable(lock, False)
    agent = socket.socket(fileno=os.dup(1))
    agent.set_inheritable(False)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1):
        os.dup2(devnull, fd)
    os.close(devnull)
    logging.basicConfig(level=logging.INFO, handlers=[BoundedLog(sys.stderr)], force=True)
    me = procfs.read_stat(os.getpid())
    assert me is not None
    write_private(
        directory / PID_FILE,
        json.dumps({"pid": me.pid, "start_time": me.start_time}).encode(),
        sync=False,
    )
    isolation.record = AttemptRecord(directory / TRACKING_FILE)
    if isolation.tracking == SUBREAPER and not become_subreaper():
        isolation.tracking = PROCESS_GROUP
    try:
        _Session(spec, isolation, agent, ending).run()
    finally:
        # Nothing of the session is left: its directory goes (the lock is released last),
        # before the agent sees this end (it ends what a directory left names).
        remove_tree(directory)
        agent.close()


class _Session:
    def __init__(
        self, spec: SessionSpec, isolation: Isolation, agent: socket.socket, ending: list[int]
    ) -> None:
        self.spec, self.isolation, self.agent, self.ending = spec, isolation, agent, ending

    def say(self, **fields: object) -> None:
        with contextlib.suppress(OSError):
            self.agent.send(encode(**fields))

    def run(self) -> None:
        spec = self.spec
        as_user = None
        if spec.user is not None:
            as_user = JobUser.named(spec.user)
            if as_user is None:
                self.say(refused=f"there is no user {spec.user} on this node")
                return
        env = {"TERM": spec.term} if spec.term else {}
        try:
            place = self.isolation.begin(
                spec.node_id, spec.session, 1, env, Limits(), as_user=as_user
            )
        except OSError as e:
            self.say(refused=f"cannot make its working directory, cgroup or UID: {e.strerror or e}")
            return
        command: Command | None = None
        try:
            cwd = place.workdir
            if spec.user is not None:
                # As a login would: the account's home, where it has one.
                home = Path(pwd.getpwnam(spec.user).pw_dir)
                place.env["HOME"] = str(home)
                if home.is_dir():
                    cwd = home
            try:
                command, theirs = self._start(place, cwd)
            except (OSError, subprocess.SubprocessError) as e:
                why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                self.say(refused=f"cannot run {spec.command[0]!r}: {why}")
                return
            place.tracking.started(command.pid)
            self._note(place, command)
            try:
                names = list(PTY_FDS if spec.tty else PIPE_FDS)
                if len(theirs) > len(names):
                    names.append(STDIN_FD)
                message = encode(started=place.applied.get("user"), fds=names)
                socket.send_fds(self.agent, [message], theirs)
            except OSError as e:
                log.warning("session %s: cannot hand it to the agent: %s", spec.session, e)
            finally:
                for fd in theirs:
                    os.close(fd)
            log.info("session %s: started process %d", spec.session, command.pid)
            self._follow(place, command)
        finally:
            _end_all(place, command)
            self.isolation.end(place)
            log.info("session %s: ended (%s)", spec.session, place.applied.get("swept", "-"))
            self.say(ended=place.applied)

    def _start(self, place: Placement, cwd: Path) -> tuple[Command, list[int]]:
        """The command started on a new PTY (or pipes): it, and the descriptors the agent
        gets (PTY_FDS, or PIPE_FDS and maybe STDIN_FD); this process keeps none of them."""
        spec, user = self.spec, place.steps.user
        mine: list[int] = []  # the command's ends: closed here once it has them
        theirs: list[int] = []
        try:
            if spec.tty:
                master, slave = os.openpty()
                theirs.append(master)
                mine.append(slave)
                fcntl.ioctl(
                    slave, termios.TIOCSWINSZ, struct.pack("HHHH", spec.rows, spec.cols, 0, 0)
                )
                if user is not None:
                    # Its own terminal, as login(1) gives one: the user may reopen /dev/tty.
                    os.fchown(slave, user.uid, user.gid)
                    os.fchmod(slave, 0o620)
                stdio = (slave, slave, slave)
            else:
                out_r, out_w = os.pipe2(os.O_CLOEXEC)
                theirs.append(out_r)
                mine.append(out_w)
                err_r, err_w = os.pipe2(os.O_CLOEXEC)
                theirs.append(err_r)
                mine.append(err_w)
                if spec.stdin:
                    in_r, in_w = os.pipe2(os.O_CLOEXEC)
                    theirs.append(in_w)
                    mine.append(in_r)
                else:
                    in_r = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                    mine.append(in_r)
                stdio = (in_r, out_w, err_w)
            command = spawn(
                spec.command, cwd=cwd, env=place.env, steps=place.steps, stdio=stdio, tty=spec.tty
            )
        except BaseException:
            for fd in theirs:
                os.close(fd)
            raise
        finally:
            for fd in mine:
                os.close(fd)
        return command, theirs

    def _note(self, place: Placement, command: Command) -> None:
        """tracking.json: what to end if this process is killed (its command with its
        start time, whatever the tracking)."""
        pids = place.tracking.recorded()
        start = procfs.read_stat(command.pid)
        if start is not None and all(pid != command.pid for pid, _ in pids):
            pids.append([command.pid, start.start_time])
        self.isolation.record.put(place.key, place.entry(pids))

    def _follow(self, place: Placement, command: Command) -> None:
        """Until the end: the command's exit said, hang-ups passed on, descendants noted."""
        selector = selectors.DefaultSelector()
        selector.register(self.agent, selectors.EVENT_READ)
        pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            pidfd = os.pidfd_open(command.pid)
            selector.register(pidfd, selectors.EVENT_READ)
        wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(wake_w)
        selector.register(wake_r, selectors.EVENT_READ)
        subreaper = place.tracking.kind == SUBREAPER
        next_scan = time.monotonic() + SCAN_EVERY
        said_exit = False
        try:
            while not self.ending:
                if not said_exit and command.poll() is not None:
                    said_exit = True
                    self.say(exit=_exit_code(command))
                timeout = None if pidfd is not None or said_exit else GONE_POLL
                if subreaper:
                    left = max(next_scan - time.monotonic(), 0.0)
                    timeout = left if timeout is None else min(timeout, left)
                for key, _ in selector.select(timeout):
                    if key.fileobj is self.agent:
                        if not self._from_agent(place):
                            return
                    elif key.fd == wake_r:
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 512)
                    elif key.fd == pidfd:
                        selector.unregister(pidfd)
                if subreaper and time.monotonic() >= next_scan:
                    next_scan = time.monotonic() + SCAN_EVERY
                    if place.tracking.refresh():
                        self._note(place, command)
        finally:
            signal.set_wakeup_fd(-1)
            selector.close()
            for fd in (wake_r, wake_w, pidfd):
                if fd is not None:
                    os.close(fd)

    def _from_agent(self, place: Placement) -> bool:
        """What the agent said; False when it is the end (asked, or the agent is gone)."""
        try:
            data = self.agent.recv(MAX_MESSAGE)
        except OSError:
            data = b""
        if not data:
            log.info("session %s: the agent has gone: ending it", self.spec.session)
            return False
        message = decode(data)
        if message.get("hangup"):
            place.tracking.signal_all(signal.SIGHUP)
            return True
        return not message.get("end")


def _exit_code(command: Command) -> int:
    returned = command.returncode
    assert returned is not None
    return 128 - returned if returned < 0 else returned


def _end_all(place: Placement, command: Command | None) -> None:
    """End whatever is left of the session (SIGHUP, then SIGKILL after HANGUP_GRACE) and
    reap its command."""
    tracking = place.tracking
    if command is not None and tracking.alive():
        tracking.signal_all(signal.SIGHUP)
        deadline = time.monotonic() + HANGUP_GRACE
        while tracking.alive() and time.monotonic() < deadline:
            command.poll()
            time.sleep(GONE_POLL)
        deadline = time.monotonic() + KILL_WITHIN
        while tracking.alive() and time.monotonic() < deadline:
            tracking.kill_all()
            command.poll()
            time.sleep(GONE_POLL)
    if command is not None:
        deadline = time.monotonic() + KILL_WITHIN
        while command.poll() is None and time.monotonic() < deadline:
            time.sleep(GONE_POLL)
    tracking.refresh()  # reaps what was adopted
