"""Jobs on the node: the `oz0.job.attempt` activity and the relay of its output.

attempt.py runs one attempt, once grants.py has checked that the cluster signed it for
this node, now, once; isolation.py says where, as whom (job_user.py) and with what limits
it runs, and tracking.py follows and ends all of its processes (a cgroup, or the agent as
their subreaper; procfs.py reads /proc); process.py starts the command and ends it;
output.py relays its output to the edge over the control stream (seq, acks, cap); link.py
crosses between the runtime's asyncio thread and the stream's Trio loop; supervisor.py is
the per-attempt process that owns a command apart from the agent.
The protocol is in docs/node-protocol.md, "Jobs".

The names below are imported when first used, not with the package: the per-attempt
supervisor imports oz0_node.jobs.supervisor, and its start-up must not pay for temporalio
and trio (attempt.py, link.py), some 0.4 s.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oz0_node.jobs.attempt import ACTIVITY, RunningAttempts, attempt_activity
    from oz0_node.jobs.link import OutputLink, StreamLink
    from oz0_node.jobs.output import OUTPUT_CAP
    from oz0_node.jobs.process import KILL_GRACE

_WHERE = {
    "ACTIVITY": "attempt",
    "RunningAttempts": "attempt",
    "attempt_activity": "attempt",
    "OutputLink": "link",
    "StreamLink": "link",
    "OUTPUT_CAP": "output",
    "KILL_GRACE": "process",
}

__all__ = [
    "ACTIVITY",
    "KILL_GRACE",
    "OUTPUT_CAP",
    "OutputLink",
    "RunningAttempts",
    "StreamLink",
    "attempt_activity",
]


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
