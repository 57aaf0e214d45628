"""Jobs on the node: the `oz0.job.attempt` activity, the attempts' supervisors, and the
manager that follows them across control streams and agent restarts.

attempt.py takes one attempt, once grants.py has checked that the cluster signed it for
this node, now, once, and hands it to manager.py, which starts its supervisor through
supervisor_client.py (the agent's handle on it; launcher.py forks it): supervisor.py is
that process of its own, which owns the command, its output file and its exit status,
and attempt_files.py holds what the two exchange. isolation.py says where, as whom
(job_user.py) and with what limits it runs, spawn.py starts the command that way (born in
its cgroup), tracking.py follows and ends all of its processes (a cgroup, or the
supervisor as their subreaper; procfs.py reads /proc), process.py ends them, and
removal.py removes its working directory (following no link). The manager relays output
and results to the edge over whichever control stream is up (edge_link.py).
The protocol is in docs/node-protocol.md, "Jobs".

The names below are imported when first used, not with the package: the per-attempt
supervisor imports oz0_node.jobs.supervisor, and its start-up must not pay for temporalio
and trio (attempt.py, manager.py), some 0.4 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oz0_node.jobs.attempt import ACTIVITY, attempt_activity
    from oz0_node.jobs.attempt_files import OUTPUT_CAP
    from oz0_node.jobs.edge_link import EdgeLink
    from oz0_node.jobs.process import KILL_GRACE

_WHERE = {
    "ACTIVITY": "attempt",
    "attempt_activity": "attempt",
    "EdgeLink": "edge_link",
    "OUTPUT_CAP": "attempt_files",
    "KILL_GRACE": "process",
}

__all__ = [
    "ACTIVITY",
    "KILL_GRACE",
    "OUTPUT_CAP",
    "EdgeLink",
    "attempt_activity",
]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
