"""The agent's supervisor launcher: one small process per agent, started with it, that forks
each attempt's supervisor (supervisor.py) out of an interpreter that has imported it once.
The agent's side, `Launcher`, is what supervisor_client.launch hands attempts to.

Started afresh for each attempt, a supervisor's interpreter and its imports took about
80 ms of CPU and of wall time, the largest share of a job's cost on the node and of its
dispatch, and a fan-out to 100 nodes on one machine started 100 of them at once. A fork of
this process costs a few milliseconds. What the supervisor guarantees stays as it was:

- `launch` (supervisor_client.py) hands the launcher, over a Unix socket (SCM_RIGHTS), four
  descriptors: the read end of a pipe that will carry the attempt (JSON, with its secrets:
  never on disk nor on a command line, and never seen by the launcher, which only passes the
  descriptor on), the write end of the pipe `launch` reads "ready" from, the supervisor's
  log file and the attempt's lock, locked by `launch`: held from before the supervisor
  exists to its end, as before;
- the launcher forks; its child (the supervisor's first process) starts a session of its
  own, says FORKED on the ready pipe, then is the supervisor's first process as under
  `python -c BOOT`: it reads the attempt, forks the supervisor and exits (the launcher
  reaps it), so the supervisor is neither the agent's child nor the launcher's, and in
  neither's session nor process group: the agent's exit, restart, SIGKILL or a kill of its
  process group does not reach it, nor the launcher's;
- `launch` writes the attempt only once it has read FORKED: until then nothing can start,
  so a launcher that is gone, does not take the descriptors (SEND_WITHIN) or does not fork
  (FORK_WITHIN) costs only the fallback, today's `python -c BOOT`. A child that finds the
  ready pipe closed (`launch` gave up) or no attempt on its pipe exits having done nothing.

A session's supervisor (session_process.py) is forked the same way, so that the agent,
which runs threads, never forks for one: `session_client.launch` sends SESSION_REQUEST with
its spec's pipe, the supervisor's end of the agent's socket in place of the ready pipe
(FORKED and all that follows go over it), the log and the lock.

The launcher runs the agent's own code (the same interpreter and sys.path), so it is one
per agent process: it exits when its socket closes, that is when its agent exits, however
(a SIGKILL too); a new agent, an upgraded one for instance, starts its own. An agent whose
launcher died starts another at its next attempt, at most once every RESTART_AFTER (the
attempts in between use the fallback).
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable

# What each supervisor would import: imported once, by the launcher, before any fork.
from oz0_node.jobs import session_process, supervisor

log = logging.getLogger(__name__)

BOOT = "from oz0_node.jobs.launcher import main; main()"
# One request: this, with the four descriptors (attempt pipe, ready pipe, log, lock).
REQUEST = b"oz0-launch 1"
# A session's (session_process.py): its spec's pipe, the agent's socket, log, lock.
SESSION_REQUEST = b"oz0-session 1"
MAX_REQUEST = 64
FORKED = b"forked\n"
# How long `launch` waits for the launcher to take the descriptors, and to fork.
SEND_WITHIN = 5.0
FORK_WITHIN = 5.0
RESTART_AFTER = 10.0
# How long a launcher whose socket was closed is waited for (it exits at once).
STOP_WITHIN = 1.0
# How soon the launcher reaps the first processes it forked (each exits within
# milliseconds, once it has forked its supervisor).
REAP_EVERY = 0.5


def supervisor_env() -> dict[str, str]:
    """The agent's environment (LANG for the job; no job's values), and its sys.path, so
    the supervisor imports what the agent does (the one-file agent's unpacked layers too)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class Launcher:
    """The agent's side: the launcher process and the socket to it (threads may share it:
    each request is one SOCK_SEQPACKET message, sent whole or not at all)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._started_at: float | None = None
        self._stopped = False

    @property
    def pid(self) -> int | None:
        """The launcher's PID while it is thought to run."""
        process = self._process
        return process.pid if process is not None and self._socket is not None else None

    def start(self) -> None:
        """Start the launcher unless it runs (the agent's start: the first attempt does not
        wait for it)."""
        with self._lock:
            if self._socket is None and not self._stopped:
                self._spawn()

    def send(self, fds: tuple[int, int, int, int], request: bytes = REQUEST) -> bool:
        """Hand FDS to the launcher (REQUEST: an attempt's supervisor, or SESSION_REQUEST a
        session's); False when it cannot take them (then it was not sent: `launch` falls
        back to a fresh interpreter). A launcher that died is started again, at most once
        every RESTART_AFTER seconds."""
        with self._lock:
            if self._socket is None:
                recent = self._started_at is not None and (
                    time.monotonic() - self._started_at < RESTART_AFTER
                )
                if self._stopped or recent:
                    return False
                self._spawn()
            sock = self._socket
        if sock is None:
            return False
        try:
            socket.send_fds(sock, [request], list(fds))
        except OSError as e:  # gone (EPIPE), or too slow to take it (TimeoutError)
            log.warning("the supervisor launcher did not take an attempt (%s): restarting it", e)
            self._lost(sock)
            return False
        return True

    def lost(self) -> None:
        """It took an attempt but did not fork in time: it is stopped, a new one started at
        the next attempt."""
        sock = self._socket
        if sock is not None:
            log.warning("the supervisor launcher did not fork in %g s: restarting it", FORK_WITHIN)
            self._lost(sock)

    def stop(self) -> None:
        """Close the socket (the launcher exits on it) and reap it; no more launches here."""
        with self._lock:
            self._stopped = True
            self._close()

    def _spawn(self) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.settimeout(SEND_WITHIN)
            self._process = subprocess.Popen(
                # -P: nothing imported from the working directory.
                [sys.executable, "-P", "-c", BOOT, str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                # Its own session: a kill of the agent's process group does not reach it,
                # nor a first process between its fork and its setsid.
                start_new_session=True,
                cwd="/",
                env=supervisor_env(),
            )
        except OSError as e:
            ours.close()
            log.warning("cannot start the supervisor launcher: %s", e.strerror or e)
            self._started_at = time.monotonic()
            return
        finally:
            theirs.close()
        self._socket = ours
        self._started_at = time.monotonic()
        log.info("started the supervisor launcher (PID %d)", self._process.pid)

    def _lost(self, sock: socket.socket) -> None:
        with self._lock:
            if self._socket is sock:
                if self._process is not None:
                    with contextlib.suppress(ProcessLookupError):
                        self._process.kill()
                self._close()

    def _close(self) -> None:
        sock, process = self._socket, self._process
        self._socket = self._process = None
        if sock is not None:
            sock.close()
        if process is not None:
            try:
                process.wait(STOP_WITHIN)
            except subprocess.TimeoutExpired:
                process.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(STOP_WITHIN)


# --- the launcher's process ----------------------------------------------------------------


def main() -> None:
    """The launcher (started by `Launcher` as `python -c BOOT FD`): take requests on FD
    until it closes."""
    sock = socket.socket(fileno=int(sys.argv[1]))
    logging.basicConfig(level=logging.INFO, format="oz0-node supervisor launcher: %(message)s")
    forked = 0  # first processes not reaped yet
    while True:
        forked -= _reap()
        # Idle, it sleeps until a request (or its agent's exit); else it reaps soon.
        wait = REAP_EVERY if forked > 0 else None
        if not select.select([sock], [], [], wait)[0]:
            continue
        try:
            message, fds, _, _ = socket.recv_fds(sock, MAX_REQUEST, 4)
        except InterruptedError:
            continue
        except OSError as e:
            log.warning("cannot read a request: %s", e)
            return
        if not message and not fds:
            return  # its agent has gone
        supervise = {REQUEST: supervisor.main, SESSION_REQUEST: session_process.main}.get(message)
        if supervise is None or len(fds) != 4:
            log.warning("not a request (%d bytes, %d descriptors): ignored", len(message), len(fds))
        else:
            try:
                pid = os.fork()
            except OSError as e:
                # Its descriptors close below: `launch` sees no FORKED and falls back.
                log.warning("cannot fork a supervisor: %s", e.strerror or e)
                pid = -1
            if pid == 0:
                _first_process(sock, fds, supervise)
            if pid > 0:
                forked += 1
        for fd in fds:
            os.close(fd)


def _reap() -> int:
    """Reap the first processes that have exited (each forks its supervisor and exits);
    how many."""
    reaped = 0
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            reaped += 1
    return reaped


def _first_process(sock: socket.socket, fds: list[int], supervise: Callable[..., None]) -> None:
    """The forked child: the supervisor's first process, as `python -c
    supervisor_client.BOOT` with the attempt's pipe on stdin, the ready pipe on stdout, the
    log on stderr (a session's: session_process.BOOT, its spec's pipe on stdin, the agent's
    socket on stdout). It never returns into the launcher's loop."""
    code = 1
    try:
        os.setsid()
        sock.close()
        attempt, ready, logs, lock = fds
        for fd, number in ((attempt, 0), (ready, 1), (logs, 2)):
            os.dup2(fd, number)
            os.close(fd)
        try:
            os.write(1, FORKED)
        except BrokenPipeError:
            code = 0  # `launch` gave up on it: it exits, having started nothing
        else:
            supervise(lock=lock)
            code = 0
    except BaseException:  # whatever it is goes to its log, never into the loop
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            logging.shutdown()
            sys.stderr.flush()
        os._exit(code)
