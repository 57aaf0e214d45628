"""An attempt's process: started in a session of its own, its output handed on as it
comes, and ended, with every process it started, when the attempt ends.

Which processes are the attempt's is its tracking's to say (isolation.py): its cgroup, or
its descendants followed by the agent as subreaper, or (where neither can be had) its
process group. A process counts as alive unless it is a zombie: orphans may be reparented
to a PID 1 that never reaps them (some containers' init does not), and a zombie holds no
resources worth waiting for.

The command's exit is watched apart from its pipes (`Child.exited`): a process it left
behind may hold them open long after it exited.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from oz0_node.jobs.tracking import Tracking

log = logging.getLogger(__name__)

# SIGTERM first; what is left of the group this long after gets SIGKILL.
KILL_GRACE = 3.0
# How often the group is looked at while it is given its grace.
GONE_POLL = 0.05
# After SIGKILL, how long the command itself may take to be reaped (a process stuck in
# the kernel cannot be killed at all; the attempt does not wait for it forever).
REAP_TIMEOUT = 2.0

PROC = Path("/proc")
STREAMS = {1: "stdout", 2: "stderr"}

# (stream name, data), as it is read.
OnOutput = Callable[[str, bytes], None]


def members(pgid: int) -> list[int]:
    """The PIDs in process group PGID that are not zombies."""
    if not PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass  # a member that changed its user: still there
        return [pgid]
    found = []
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_bytes()
        except OSError:
            continue  # it ended while we looked
        # pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) >= 3 and int(fields[2]) == pgid and fields[0] != b"Z":
            found.append(int(entry.name))
    return found


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


class Child(asyncio.SubprocessProtocol):
    """The command's process, as its asyncio protocol: output to ON_OUTPUT, exit noticed."""

    def __init__(self, on_output: OnOutput, tracking: Tracking) -> None:
        self._on_output = on_output
        self.tracking = tracking
        self.exited = asyncio.Event()
        self.pipes_closed = asyncio.Event()
        self._open_pipes = set(STREAMS)
        self._transport: asyncio.SubprocessTransport | None = None

    # --- the protocol (called by the loop) ----------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.SubprocessTransport, transport)

    def pipe_data_received(self, fd: int, data: bytes | bytearray) -> None:
        self._on_output(STREAMS[fd], bytes(data))

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open_pipes.discard(fd)
        if not self._open_pipes:
            self.pipes_closed.set()

    def process_exited(self) -> None:
        self.exited.set()

    # --- for the attempt ----------------------------------------------------------------

    @property
    def pid(self) -> int:
        assert self._transport is not None
        pid = self._transport.get_pid()
        assert isinstance(pid, int)
        return pid

    @property
    def returncode(self) -> int | None:
        assert self._transport is not None
        return self._transport.get_returncode()

    async def end(self, *, grace: float = KILL_GRACE) -> None:
        """End every process of the attempt: SIGTERM, then SIGKILL after GRACE seconds.

        Returns once they are gone and the command has been reaped (or REAP_TIMEOUT after
        the SIGKILL, if the kernel holds on to one). Signals nothing when none is left.
        """
        tracking = self.tracking
        if self.exited.is_set() and not tracking.alive():
            return
        loop = asyncio.get_running_loop()
        tracking.signal_all(signal.SIGTERM)
        deadline = loop.time() + grace
        # Nothing tells when the last of them is gone: look.
        while tracking.alive() and loop.time() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(GONE_POLL)
        left = tracking.alive()
        if left:
            log.info(
                "process %d: %d process(es) of its attempt still there %g s after SIGTERM; SIGKILL",
                self.pid,
                len(left),
                grace,
            )
            tracking.kill_all()
        deadline = loop.time() + REAP_TIMEOUT
        # Again and again: one that forked meanwhile (subreaper, process group) dies too.
        while tracking.alive() and loop.time() < deadline:
            tracking.kill_all()
            await asyncio.sleep(GONE_POLL)
        try:
            await asyncio.wait_for(self.exited.wait(), max(deadline - loop.time(), 0))
        except TimeoutError:
            log.warning("process %d did not end %g s after SIGKILL", self.pid, REAP_TIMEOUT)
        tracking.refresh()  # reap what was adopted

    def close(self) -> None:
        """Let go of the pipes (the group has been ended)."""
        if self._transport is not None:
            self._transport.close()


async def spawn(
    argv: tuple[str, ...],
    *,
    cwd: Path,
    env: Mapping[str, str],
    on_output: OnOutput,
    tracking: Tracking,
    preexec: Callable[[], None] | None = None,
) -> Child:
    """Start ARGV in a session of its own, stdin /dev/null, its output to ON_OUTPUT; the
    child runs PREEXEC (isolation.py: cgroups, rlimits, the job user) just before exec.

    Raises OSError when it cannot be started (not found, not executable), and
    subprocess.SubprocessError when PREEXEC failed."""
    loop = asyncio.get_running_loop()
    _, child = await loop.subprocess_exec(
        lambda: Child(on_output, tracking),
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=cwd,
        env=dict(env),
        start_new_session=True,
        preexec_fn=preexec,
    )
    tracking.started(child.pid)
    return child
