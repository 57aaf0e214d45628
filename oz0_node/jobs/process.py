"""How an attempt's processes are ended (the supervisor's, supervisor.py, and a plugin's):
SIGTERM, then SIGKILL after KILL_GRACE.

Which processes are the attempt's is its tracking's to say (isolation.py): its cgroup, or
its descendants followed by the supervisor as subreaper, or (where neither can be had) its
process group. A process counts as alive unless it is a zombie: orphans may be reparented
to a PID 1 that never reaps them (some containers' init does not), and a zombie holds no
resources worth waiting for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal

from oz0_node.jobs import procfs

log = logging.getLogger(__name__)

# SIGTERM first; what is left of the group this long after gets SIGKILL.
KILL_GRACE = 3.0
# How often the group is looked at while it is given its grace.
GONE_POLL = 0.05
# After SIGKILL, how long the command itself may take to be reaped (a process stuck in
# the kernel cannot be killed at all; the attempt does not wait for it forever).
REAP_TIMEOUT = 2.0


def members(pgid: int) -> list[int]:
    """The PIDs in process group PGID that are not zombies."""
    if not procfs.PROC.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass  # a member that changed its user: still there
        return [pgid]
    return [s.pid for s in procfs.all_stats() if s.pgrp == pgid and not s.zombie]


def signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)
