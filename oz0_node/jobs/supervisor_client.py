"""The agent's handle on its attempts' supervisors (supervisor.py: a process of its own per
attempt, which owns the command, its output and its exit status; Nomad's executor client
is the same idea).

`launch` starts one: forked by the agent's launcher (launcher.py: no interpreter to start
nor modules to import) or, when there is none, started afresh as `python -c BOOT`. It makes
the attempt's directory, takes its lock before the supervisor exists and hands it down,
hands the attempt over (attempt_files.handover: its secrets over a pipe, never on disk nor
on a command line), and returns once the supervisor says it started the command (or
failed to).

`Supervised` is one attempt's directory and what the agent does with it: whether its
supervisor still runs (`alive`: it holds DIR/lock), how it ended (`status`), its output
(`read_output`), asking it to stop, ending what a dead one left (`end_leftovers`) and
removing the directory once the attempt is reported. A new agent finds every attempt a
previous one left (`find_all`). The directory's files are attempt_files.py's.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from oz0_node.jobs import procfs
from oz0_node.jobs.attempt_files import (
    ATTEMPT_DIR,
    CODE_STREAMS,
    HEADER,
    LOCK_FILE,
    LOG_FILE,
    MARK,
    OUTPUT_FILE,
    PID_FILE,
    READY,
    STATUS_FILE,
    TRACKING_FILE,
    AttemptStatus,
    OutputRecord,
    SupervisedSpec,
    attempts_root,
    handover,
)
from oz0_node.jobs.isolation import AttemptRecord, Isolation, end_recorded
from oz0_node.jobs.launcher import FORK_WITHIN, FORKED, Launcher, supervisor_env
from oz0_node.jobs.process import REAP_TIMEOUT
from oz0_node.jobs.removal import remove_tree

log = logging.getLogger(__name__)

# How long `launch` waits for the supervisor to say it started the command (or failed to).
START_WITHIN = 30.0
BOOT = "from oz0_node.jobs.supervisor import main; main()"


@dataclass(frozen=True)
class Supervised:
    """One attempt's directory and the supervisor that has (or had) it."""

    job_id: str
    attempt: int
    dir: Path

    def alive(self) -> bool:
        """Whether its supervisor still runs: it holds DIR/lock for its whole life."""
        try:
            fd = os.open(self.dir / LOCK_FILE, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # releases the lock, if this took it
        return False

    def status(self) -> AttemptStatus | None:
        """The attempt's status once it has ended and its leftovers are gone, else None
        (also when it cannot be read: logged)."""
        try:
            return AttemptStatus.decode((self.dir / STATUS_FILE).read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", self.dir / STATUS_FILE, e)
            return None

    def stop(self) -> None:
        """Ask the supervisor to end the attempt now (SIGTERM; its PID is checked with its
        start time, so never a process that reused it). Returns at once: `status` says
        "stopped" once it has ended."""
        found = self._supervisor()
        if found is not None and self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(found, signal.SIGTERM)

    def _supervisor(self) -> int | None:
        """The supervisor's PID while it is the process that wrote DIR/supervisor.json."""
        try:
            raw = json.loads((self.dir / PID_FILE).read_bytes())
            pid, start = int(raw["pid"]), int(raw["start_time"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        stat = procfs.same_process(pid, start) if pid > 1 else None
        return pid if stat is not None and not stat.zombie else None

    def read_output(self, offset: int, limit: int) -> tuple[list[OutputRecord], int]:
        """The whole records from byte OFFSET of DIR/output, at most LIMIT bytes of data
        (one record at least, if there is one), and the offset after them. A record still
        being written is left for the next call. ValueError if the file is not one of
        these (a stream code this node does not write)."""
        records: list[OutputRecord] = []
        taken = 0
        try:
            f = (self.dir / OUTPUT_FILE).open("rb")
        except FileNotFoundError:
            return records, offset
        with f:
            f.seek(offset)
            while True:
                header = f.read(HEADER.size)
                if len(header) < HEADER.size:
                    break
                code, length = HEADER.unpack(header)
                if records and taken + length > limit:
                    break
                data = f.read(length)
                if len(data) < length:
                    break
                stream = CODE_STREAMS.get(code & ~MARK)
                if stream is None:
                    raise ValueError(f"{self.dir / OUTPUT_FILE}: no such stream code {code}")
                records.append(OutputRecord(stream, data, truncated=bool(code & MARK)))
                taken += length
                offset += HEADER.size + length
        return records, offset

    def end_leftovers(self) -> None:
        """Its supervisor died without a status (kill -9, OOM): end what is left of its
        command (its cgroups; its recorded processes, each checked by its start time) and
        remove its working directory and cgroups. Nothing while the supervisor lives."""
        if self.alive():
            return
        entries = AttemptRecord(self.dir / TRACKING_FILE).load()
        for key, entry in entries.items():
            processes, removed = end_recorded(entry)
            cgroups = entry.get("cgroups")
            for raw in cgroups if isinstance(cgroups, list) else []:
                # The node's subtree too once no attempt is left in it, as Isolation.end.
                with contextlib.suppress(OSError, TypeError):
                    Path(raw).parent.rmdir()
            log.info(
                "attempt %s: its supervisor died; ended %d process(es)%s",
                key,
                processes,
                f", removed {removed}" if removed is not None else "",
            )
        # Said once only: a second call finds nothing to end.
        (self.dir / TRACKING_FILE).unlink(missing_ok=True)

    def end_now(self, within: float) -> None:
        """Stop the attempt and wait for it (at most WITHIN seconds; then SIGKILL), then end
        whatever its supervisor left: the attempt is over when this returns."""
        self.stop()
        deadline = time.monotonic() + within
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        self.kill_late(within)

    def kill_late(self, waited: float) -> None:
        """After a stop that WAITED seconds: SIGKILL a supervisor still up, then end what
        it left."""
        pid = self._supervisor() if self.alive() else None
        if pid is not None:
            log.warning(
                "attempt %s: its supervisor did not stop in %g s; SIGKILL", self.dir.name, waited
            )
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            end = time.monotonic() + REAP_TIMEOUT
            while self.alive() and time.monotonic() < end:
                time.sleep(0.02)
        self.end_leftovers()

    def remove(self) -> None:
        """Delete DIR (once the agent has reported the attempt)."""
        remove_tree(self.dir)


def find_all(data_dir: Path) -> list[Supervised]:
    """Every attempt directory under DATA_DIR/attempts (for a new agent), sorted."""
    found = []
    try:
        names = sorted(p.name for p in attempts_root(data_dir).iterdir())
    except FileNotFoundError:
        return []
    for name in names:
        match = ATTEMPT_DIR.fullmatch(name)
        if match is not None:
            found.append(Supervised(match[1], int(match[2]), attempts_root(data_dir) / name))
    return found


def stop_all(data_dir: Path, within: float) -> int:
    """Stop every live supervisor, wait for them (at most WITHIN seconds; then SIGKILL),
    end what dead ones left and remove every attempt directory: after a purge nothing of
    any attempt is left. How many attempts there were."""
    every = find_all(data_dir)
    for supervised in every:
        supervised.stop()
    deadline = time.monotonic() + within
    while any(s.alive() for s in every) and time.monotonic() < deadline:
        time.sleep(0.05)
    for supervised in every:
        supervised.kill_late(within)
        supervised.remove()
    return len(every)


def launch(
    data_dir: Path,
    spec: SupervisedSpec,
    isolation: Isolation,
    launcher: Launcher | None = None,
) -> Supervised:
    """Start SPEC's supervisor; return once it has started the command or failed to (then
    its status says exit 127 or 126 and its output has a line on stderr saying why).

    Forked by LAUNCHER (the agent's: launcher.py) when it takes the attempt, else started
    as a fresh interpreter (`python -c BOOT`).

    OSError when the attempt's directory cannot be made (or Python cannot be started);
    FileExistsError when a live supervisor already has it."""
    root = attempts_root(data_dir)
    root.mkdir(mode=0o700, exist_ok=True)
    root.chmod(0o700)
    supervised = Supervised(spec.job_id, spec.attempt, root / spec.key)
    if supervised.dir.exists():
        if supervised.alive():
            raise FileExistsError(
                errno.EEXIST, "a supervisor already runs this attempt", str(supervised.dir)
            )
        # What a previous run of the same attempt left (its status already reported).
        supervised.end_leftovers()
        supervised.remove()
    supervised.dir.mkdir(mode=0o700)
    # Locked here and handed down: held from before the supervisor exists to its end.
    lock = os.open(supervised.dir / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        handed = handover(spec, isolation, supervised.dir, lock)
        logs = os.open(
            supervised.dir / LOG_FILE,
            os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
            0o600,
        )
        try:
            ready = None
            if launcher is not None:
                ready = _through_launcher(launcher, handed, logs, lock)
            if ready is None:
                ready = _through_interpreter(handed, logs, lock, spec.key)
        finally:
            os.close(logs)
    finally:
        os.close(lock)
    if not ready:
        log.warning(
            "attempt %s: its supervisor did not say it started the command (%s)",
            spec.key,
            supervised.dir / LOG_FILE,
        )
    return supervised


def _through_launcher(launcher: Launcher, handed: bytes, logs: int, lock: int) -> bool | None:
    """HANDED (the handover) to a supervisor the launcher forks; whether it said READY, or
    None when the launcher did not fork one (nothing was started: the caller starts it
    otherwise)."""
    attempt_r, attempt_w = os.pipe2(os.O_CLOEXEC)
    ready_r, ready_w = os.pipe2(os.O_CLOEXEC)
    try:
        try:
            sent = launcher.send((attempt_r, ready_w, logs, lock))
        finally:
            # Only the launcher's child holds these now: its exit (or the launcher's) is EOF.
            os.close(attempt_r)
            os.close(ready_w)
        if not sent:
            return None
        lines = _Lines(ready_r)
        forked = lines.next(FORK_WITHIN)
        if forked != FORKED:
            if forked is None:
                launcher.lost()
            # Not forked, or forked too late: the child finds no attempt and exits.
            return None
        with contextlib.suppress(BrokenPipeError):
            _write_all(attempt_w, handed)
        os.close(attempt_w)
        attempt_w = -1
        return lines.next(START_WITHIN) == READY
    finally:
        for fd in (attempt_w, ready_r):
            if fd >= 0:
                os.close(fd)


def _through_interpreter(handed: bytes, logs: int, lock: int, key: str) -> bool:
    """HANDED (the handover) to a supervisor started as a fresh interpreter; whether it said
    READY."""
    process = subprocess.Popen(
        # -P: nothing imported from the working directory.
        [sys.executable, "-P", "-c", BOOT],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=logs,
        pass_fds=(lock,),
        start_new_session=True,
        cwd="/",
        env=supervisor_env(),
    )
    assert process.stdin is not None and process.stdout is not None
    with contextlib.suppress(BrokenPipeError):
        process.stdin.write(handed)
    with contextlib.suppress(BrokenPipeError):
        process.stdin.close()
    ready = _Lines(process.stdout.fileno()).next(START_WITHIN) == READY
    process.stdout.close()
    try:
        # Its first process exits as soon as it has forked the supervisor.
        process.wait(START_WITHIN)
    except subprocess.TimeoutExpired:
        log.warning("attempt %s: its supervisor's first process did not exit", key)
    return ready


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class _Lines:
    """The lines a supervisor's first process and the supervisor write to `launch`."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.got = b""

    def next(self, within: float) -> bytes | None:
        """The next whole line; b"" at EOF (what came before a newline is dropped), None
        when none came within WITHIN seconds."""
        deadline = time.monotonic() + within
        while b"\n" not in self.got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            piece = os.read(self.fd, 64)
            if not piece:
                return b""
            self.got += piece
        line, _, self.got = self.got.partition(b"\n")
        return line + b"\n"
