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

Its modules:

- `attempt_uids.py`: each attempt a UID of its own (as systemd's `DynamicUser=`, Nomad's
  dynamic workload users), for an agent running as root without `--job-user`
  (docs/manage-nodes.md, "What a job can reach").
- `file_push.py`: a file push's part, run by the agent itself (docs/files.md; the order's
  format is oz0_common/file_push.py).
- `intake.py`: attempts the edge sends over the control stream (`attempt`,
  docs/node-protocol.md, "Attempts over the stream"): checked, handed to the attempt
  manager, answered.
- `manager_port.py`: the attempt manager as the runtime's asyncio thread reaches it, through
  the agent's portal (the manager itself runs in Trio).
- `private_tmp.py`: an attempt's own /tmp and /var/tmp, as systemd's `PrivateTmp=`: the
  command starts in a mount namespace of its own (unshare CLONE_NEWNS).
- `session_client.py`: the agent's handle on its sessions' supervisors (session_process.py;
  the messages: session_handover.py).
- `session_handover.py`: what the agent and a session's supervisor exchange, defined once
  for both sides (the agent's, session_client.py; the supervisor's process,
  session_process.py).
- `session_process.py`: a session's supervisor (docs/sessions.md): the process that sets a
  session up, starts its command and ends it, so that the agent, which runs threads
  (Temporal's worker, the websocket's).
- `uid_sweep.py`: what is left of a UID on the machine, found and removed: its processes (by
  /proc), its System V IPC objects (/proc/sysvipc) and its files in the machine's shared
  writable places (/tmp, /var/tmp).
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
