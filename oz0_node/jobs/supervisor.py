"""One attempt's supervisor: a process of its own, not the agent, that owns the attempt's
command, its output and its exit status, so that the agent's restart, crash or upgrade
does not touch the command (Nomad's executor is the same idea; the agent's handle on it is
supervisor_client.py, the files they share attempt_files.py).

The agent starts one per attempt (supervisor_client.launch): Python running this module,
forked by the agent's launcher (launcher.py) or started afresh; in a session of its own and
no longer the agent's child (it forks once at start and its first process exits), so
neither the agent's exit, SIGTERM, SIGKILL nor a kill of the agent's process group reaches
it. The attempt (with its secrets) comes over its stdin as JSON, never on disk nor on a
command line. It then

- sets the attempt up with the agent's Isolation (isolation.py: the job user, a clean
  environment, a fresh working directory, a cgroup or, as the command's parent, subreaper
  tracking, the limits), starts the command (spawn.py: born in its cgroup; without asyncio,
  whose import alone is slow), then says "ready" to `launch`;
- appends the command's output to DIR/output as it comes (below);
- ends the command at its timeout, or when asked (SIGTERM: `Supervised.stop`), SIGTERM
  then SIGKILL (cgroup.kill) after KILL_GRACE; once the command has exited, ends whatever
  it left running (its cgroup, or its tracked descendants);
- records in DIR/tracking.json (0600, replaced atomically) what is left to end if it is
  killed itself (its cgroups, its processes with their start times): `end_leftovers`;
- removes the working directory and cgroups, then writes DIR/status.json (0600,
  atomically): the attempt has ended, nothing of it is left, DIR/output is complete;
- holds an exclusive flock on DIR/lock for its whole life (taken by `launch` before the
  supervisor exists, and handed down to it): `alive` is whether that lock is held.

Its own log lines go to DIR/supervisor.log (at most LOG_CAP bytes; never an environment
value). DIR is DATA_DIR/attempts/<job>-<n> (0700): a new agent finds every attempt there
(`find_all`), re-attaches to the live ones, reads the ended ones' status and output, ends
what dead ones left, and `remove`s each once reported.

DIR/output: records as attempt_files.py frames them, in the order the output came. At
OUTPUT_CAP bytes of data (both streams together, as the manager's relay to the edge counts)
one mark record with no data, then the rest is read and dropped, so the command never
blocks on a full pipe. A record is written per read of a pipe (split at RECORD_DATA), so an
attempt's output file holds at most OUTPUT_CAP bytes of data plus 5 a record: about 1.1 MiB
for output written in lines, 6 MiB at the very worst (a command writing one byte at a
time). That is what a node keeps of an attempt's output while it has no stream to deliver
it on, or while its agent restarts.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import IO

from oz0_common.attempt_messages import AttemptResult, EndedBecause
from oz0_common.files import write_private
from oz0_node.jobs import procfs
from oz0_node.jobs.attempt_files import (
    HEADER,
    LOG_CAP,
    MARK,
    OUTPUT_CAP,
    OUTPUT_FILE,
    PID_FILE,
    READY,
    RECORD_DATA,
    STATUS_FILE,
    STREAM_CODES,
    TRACKING_FILE,
    AttemptStatus,
    SupervisedSpec,
    parse_handover,
)
from oz0_node.jobs.isolation import AttemptRecord, Isolation, Placement
from oz0_node.jobs.process import GONE_POLL, KILL_GRACE, REAP_TIMEOUT
from oz0_node.jobs.spawn import Command, spawn, unignore_inherited
from oz0_node.jobs.tracking import PROCESS_GROUP, SCAN_EVERY, SUBREAPER, become_subreaper

log = logging.getLogger(__name__)

# attempt.py's DRAIN_TIMEOUT: how long pipes held by a process that escaped its tracking
# are read once the command's processes are gone.
DRAIN_TIMEOUT = 5.0


class OutputFile:
    """DIR/output, appended as the command's output comes (see the module's docstring)."""

    def __init__(self, path: Path, cap: int = OUTPUT_CAP) -> None:
        self.cap = cap
        self.output_bytes = 0
        self.truncated = False
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)

    def add(self, stream: str, data: bytes) -> None:
        if self.truncated or not data:
            return
        code = STREAM_CODES[stream]
        kept = data[: self.cap - self.output_bytes]
        for start in range(0, len(kept), RECORD_DATA):
            self._write(code, kept[start : start + RECORD_DATA])
        self.output_bytes += len(kept)
        if len(kept) < len(data):
            self._write(code | MARK, b"")
            self.truncated = True

    def _write(self, code: int, data: bytes) -> None:
        if self.truncated:
            return
        try:
            os.write(self._fd, HEADER.pack(code, len(data)) + data)
        except OSError as e:
            # The disk is full: the output ends here, as at the cap (nothing more is kept).
            log.warning("cannot write the output: %s; the rest is dropped", e.strerror or e)
            self.truncated = True

    def close(self) -> None:
        os.close(self._fd)


class BoundedLog(logging.Handler):
    """Log lines to STREAM until LOG_CAP bytes were written, then one line saying so."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__()
        self.stream = stream
        self.written = 0
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if self.written >= LOG_CAP:
            return
        line = self.format(record) + "\n"
        if self.written + len(line) > LOG_CAP:
            line = "supervisor.log is full: later lines are dropped\n"
            self.written = LOG_CAP
        else:
            self.written += len(line)
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(line)
            self.stream.flush()


def main(lock: int | None = None) -> None:
    """The supervisor's process: started by `launch` as `python -c BOOT`, or forked by the
    launcher (launcher.py), which passes LOCK, the lock's descriptor in this process."""
    handed = read_all(0)
    if not handed:
        return  # `launch` gave up on this one before handing it anything: nothing starts
    raw = json.loads(handed)
    # Whatever the agent's thread that launched it blocked (a fork keeps its signal mask):
    # a stop must get through, and the command must not start with signals blocked.
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    # Nor ignoring what the agent was started ignoring.
    unignore_inherited()
    # A SIGTERM from now on is a stop (`Supervised.stop`), not its death.
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    # Not the agent's child from now on: the first process exits, the agent reaps it.
    if os.fork() != 0:
        os._exit(0)
    spec, isolation, directory, handed_lock = parse_handover(raw)
    del raw, handed  # the job's environment stays in SPEC only
    lock = handed_lock if lock is None else lock
    os.set_inheritable(lock, False)  # held to the end, never given to the command
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 0)
    os.close(devnull)
    handler = BoundedLog(sys.stderr)
    # force: forked by the launcher, whose own handler must not take these lines.
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    me = procfs.read_stat(os.getpid())
    assert me is not None
    write_private(
        directory / PID_FILE,
        json.dumps({"pid": me.pid, "start_time": me.start_time}).encode(),
        sync=False,  # a live process: nothing to find after the machine's crash
    )
    # What it records of its attempt goes to DIR/tracking.json, not the agent's record.
    isolation.record = AttemptRecord(directory / TRACKING_FILE)
    if isolation.tracking == SUBREAPER and not become_subreaper():
        isolation.tracking = PROCESS_GROUP
    output = OutputFile(directory / OUTPUT_FILE)
    try:
        status = _supervise(spec, isolation, output, stopping)
    finally:
        output.close()
    write_private(directory / STATUS_FILE, status.encode())
    log.info(
        "job %s attempt %d: ended (%s)", spec.job_id, spec.attempt, status.result.ended_because
    )
    # Exiting releases the lock: the status is there before the agent can see it dead.


def read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 16):
        chunks.append(chunk)
    return b"".join(chunks)


def _ready() -> None:
    """Tell `launch` the command has started (or failed to); stdout is /dev/null after."""
    with contextlib.suppress(OSError):
        os.write(1, READY)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _status(
    exit_code: int | None,
    sig: int | None,
    ended_because: EndedBecause,
    output: OutputFile,
    applied: dict[str, object],
) -> AttemptStatus:
    """The status file's content: the attempt's result as the node reports it."""
    result = AttemptResult(
        exit_code, sig, ended_because, output.output_bytes, output.truncated,
        dict(applied),
    )  # fmt: skip
    return AttemptStatus(result)


def _supervise(
    spec: SupervisedSpec, isolation: Isolation, output: OutputFile, stopping: list[int]
) -> AttemptStatus:
    try:
        place = isolation.begin(
            spec.node_id, spec.job_id, spec.attempt, spec.env, spec.limits, spec.files
        )
    except OSError as e:
        why = f"{e.strerror or e} ({e.filename or isolation.temp_dir})"
        log.warning("job %s attempt %d: cannot set it up: %s", spec.job_id, spec.attempt, why)
        line = f"oz0-node: cannot make its working directory, cgroup or UID: {why}\n"
        output.add("stderr", line.encode())
        _ready()
        return _status(126, None, EndedBecause.EXIT, output, {})
    try:
        status = _run(spec, isolation, place, output, stopping)
    finally:
        isolation.end(place)
    # What the end found (its own /tmp held, the sweep of its UID) is part of what applied.
    return replace(status, result=replace(status.result, applied=dict(place.applied)))


def _run(
    spec: SupervisedSpec,
    isolation: Isolation,
    place: Placement,
    output: OutputFile,
    stopping: list[int],
) -> AttemptStatus:
    try:
        popen = spawn(spec.command, cwd=place.workdir, env=place.env, steps=place.steps)
    except (OSError, subprocess.SubprocessError) as e:
        # As attempt.py says it: 127 not found, 126 not runnable or not isolated.
        if isinstance(e, OSError):
            code = 127 if isinstance(e, FileNotFoundError) else 126
            why = e.strerror or str(e)
        else:
            code, why = 126, "cannot isolate it (cgroup, limits or job user)"
            log.warning("job %s attempt %d: %s", spec.job_id, spec.attempt, why)
        output.add("stderr", f"oz0-node: cannot run {spec.command[0]!r}: {why}\n".encode())
        _ready()
        return _status(code, None, EndedBecause.EXIT, output, place.applied)
    place.tracking.started(popen.pid)
    command = _Command(popen, place, output, stopping, isolation)
    command.note()
    _ready()
    log.info("job %s attempt %d: started process %d", spec.job_id, spec.attempt, popen.pid)
    try:
        deadline = time.monotonic() + spec.timeout if spec.timeout is not None else None
        ended_because = command.run_until(deadline)
        # Looked for once (a scan of /proc, when subreaper): end() is told what was found.
        left = place.tracking.alive() if ended_because is EndedBecause.EXIT else None
        if left:
            log.info(
                "job %s attempt %d: ending what the command left running",
                spec.job_id,
                spec.attempt,
            )
        elif ended_because is not EndedBecause.EXIT:
            why = "asked to stop" if stopping else f"timed out after {spec.timeout:g} s"
            log.info("job %s attempt %d: %s; ending it", spec.job_id, spec.attempt, why)
        command.end(KILL_GRACE, left)
        # A pipe held by a process that escaped its tracking is not waited for.
        command.drain(DRAIN_TIMEOUT)
    finally:
        command.close()
    returned = popen.returncode
    sig = -returned if returned is not None and returned < 0 else None
    if ended_because is not EndedBecause.EXIT:
        return _status(None, sig, ended_because, output, place.applied)
    assert returned is not None
    exit_code = 128 + sig if sig is not None else returned
    return _status(exit_code, sig, EndedBecause.EXIT, output, place.applied)


class _Command:
    """The command's process as the supervisor follows it, in one thread and no event loop
    (asyncio's import alone would add a third to the supervisor's start): its pipes read
    into the output file, its exit seen through a pidfd, a SIGTERM through a wake-up pipe,
    its descendants looked for every SCAN_EVERY (subreaper tracking). What process.Child
    does for attempts the agent runs itself."""

    def __init__(
        self,
        popen: Command,
        place: Placement,
        output: OutputFile,
        stopping: list[int],
        isolation: Isolation,
    ) -> None:
        self.popen = popen
        self.place = place
        self.tracking = place.tracking
        self.output = output
        self.stopping = stopping
        self.isolation = isolation
        self.start = procfs.read_stat(popen.pid)
        self.selector = selectors.DefaultSelector()
        self.pipes: dict[int, str] = {}
        for stream, pipe in (("stdout", popen.stdout), ("stderr", popen.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self.selector.register(pipe.fileno(), selectors.EVENT_READ, stream)
            self.pipes[pipe.fileno()] = stream
        self.pidfd: int | None = None
        with contextlib.suppress(OSError, AttributeError):  # before Linux 5.3: polled
            self.pidfd = os.pidfd_open(popen.pid)
            self.selector.register(self.pidfd, selectors.EVENT_READ, None)
        # A signal's number is written here by the interpreter: select wakes up at once.
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        signal.set_wakeup_fd(self.wake_w)
        self.selector.register(self.wake_r, selectors.EVENT_READ, None)
        self.next_scan = time.monotonic()

    def exited(self) -> bool:
        return self.popen.poll() is not None

    def pump(self, timeout: float | None) -> None:
        """Wait at most TIMEOUT for output, the command's exit or a signal; take the output."""
        if self.pidfd is None:
            timeout = GONE_POLL if timeout is None else min(timeout, GONE_POLL)
        if self.tracking.kind == SUBREAPER:
            until_scan = max(self.next_scan - time.monotonic(), 0.0)
            timeout = until_scan if timeout is None else min(timeout, until_scan)
        for key, _ in self.selector.select(timeout):
            fd = key.fd
            if fd in self.pipes:
                self._read(fd)
            elif fd == self.wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(fd, 512)
            elif fd == self.pidfd:
                # It stays readable once the command has exited: not looked at again.
                self.selector.unregister(fd)
                self.popen.poll()
        if self.tracking.kind == SUBREAPER and time.monotonic() >= self.next_scan:
            self.next_scan = time.monotonic() + SCAN_EVERY
            if self.tracking.refresh():
                self.note()

    def _read(self, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            self.output.add(self.pipes[fd], data)
            return
        self.selector.unregister(fd)
        del self.pipes[fd]

    def note(self) -> None:
        _note(self.isolation, self.place, self.popen.pid, self.start)

    def run_until(self, deadline: float | None) -> EndedBecause:
        """Follow the command until it exits, a stop or DEADLINE (a timeout)."""
        while True:
            if self.exited():
                return EndedBecause.EXIT
            if self.stopping:
                return EndedBecause.STOPPED
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return EndedBecause.TIMEOUT
            self.pump(deadline - now if deadline is not None else None)

    def end(self, grace: float, alive: list[int] | None = None) -> None:
        """End every process of the attempt: SIGTERM, then SIGKILL after GRACE seconds;
        return once they are gone and the command reaped (or REAP_TIMEOUT after the
        SIGKILL). Signals nothing when none is left (ALIVE: what tracking.alive() has just
        said, if it was asked). As process.Child.end."""
        tracking = self.tracking
        if self.exited() and not (tracking.alive() if alive is None else alive):
            return
        tracking.signal_all(signal.SIGTERM)
        deadline = time.monotonic() + grace
        # Nothing tells when the last of them is gone: look (reading their output meanwhile).
        while tracking.alive() and time.monotonic() < deadline:
            self.pump(GONE_POLL)
        left = tracking.alive()
        if left:
            log.info(
                "process %d: %d process(es) of its attempt still there %g s after SIGTERM; SIGKILL",
                self.popen.pid,
                len(left),
                grace,
            )
            tracking.kill_all()
        deadline = time.monotonic() + REAP_TIMEOUT
        # Again and again: one that forked meanwhile (subreaper, process group) dies too.
        while tracking.alive() and time.monotonic() < deadline:
            tracking.kill_all()
            self.pump(GONE_POLL)
        while not self.exited() and time.monotonic() < deadline:
            self.pump(GONE_POLL)
        if not self.exited():
            log.warning("process %d did not end %g s after SIGKILL", self.popen.pid, REAP_TIMEOUT)
        tracking.refresh()  # reap what was adopted

    def drain(self, within: float) -> None:
        """Read the pipes until they close, at most WITHIN seconds."""
        deadline = time.monotonic() + within
        while self.pipes and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())

    def close(self) -> None:
        signal.set_wakeup_fd(-1)
        self.selector.close()
        for fd in (self.wake_r, self.wake_w, self.pidfd):
            if fd is not None:
                os.close(fd)
        for pipe in (self.popen.stdout, self.popen.stderr):
            if pipe is not None:
                pipe.close()


def _note(
    isolation: Isolation, place: Placement, command: int, start: procfs.ProcStat | None
) -> None:
    """DIR/tracking.json: PLACE's directory, cgroups and processes, with the command itself
    whatever the tracking (its PID and start time: never a process that reused it)."""
    pids = place.tracking.recorded()
    if start is not None and all(pid != command for pid, _ in pids):
        pids.append([command, start.start_time])
    isolation.record.put(place.key, place.entry(pids))
