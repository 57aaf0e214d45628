"""An attempt's process group: who is still in it, and ending all of it.

The command is started in a session (and so a process group) of its own; whatever it
starts stays in that group unless it leaves on purpose (`setsid`), so the group is what
an attempt's end kills. A member counts as alive unless it is a zombie: orphans are
reparented to PID 1, which may never reap them (some containers' init does not), and a
zombie holds no resources worth waiting for. Linux's /proc tells zombies apart; elsewhere
`killpg(pgid, 0)` is the best there is.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path

log = logging.getLogger(__name__)

# SIGTERM first; what is left of the group this long after gets SIGKILL.
KILL_GRACE = 3.0
# How often the group is looked at while it is given its grace.
GONE_POLL = 0.05
# After SIGKILL, how long the command itself may take to be reaped (a process stuck in
# the kernel cannot be killed at all; the attempt does not wait for it forever).
REAP_TIMEOUT = 2.0

PROC = Path("/proc")


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


async def end_group(process: asyncio.subprocess.Process, *, grace: float = KILL_GRACE) -> None:
    """End every process of PROCESS's group: SIGTERM, then SIGKILL after GRACE seconds.

    Returns once the group is gone and PROCESS has been reaped (or REAP_TIMEOUT after the
    SIGKILL, if the kernel holds it). Nothing is signalled if the group is already empty.
    """
    pgid = process.pid  # its own session: the group's ID is the leader's PID
    if process.returncode is not None and not members(pgid):
        return
    loop = asyncio.get_running_loop()
    signal_group(pgid, signal.SIGTERM)
    deadline = loop.time() + grace
    # Nothing tells when the last member of a group is gone: look.
    while members(pgid) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(GONE_POLL)
    left = members(pgid)
    if left:
        log.info(
            "process group %d: %d process(es) still there %g s after SIGTERM; sending SIGKILL",
            pgid,
            len(left),
            grace,
        )
        signal_group(pgid, signal.SIGKILL)
    deadline = loop.time() + REAP_TIMEOUT
    while members(pgid) and loop.time() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(GONE_POLL)
    try:
        await asyncio.wait_for(process.wait(), max(deadline - loop.time(), 0))
    except TimeoutError:
        log.warning("process %d did not end %g s after SIGKILL", pgid, REAP_TIMEOUT)
