"""Jobs on the node: the `oz0.job.attempt` activity and the relay of its output.

attempt.py runs one attempt, once grants.py has checked that the cluster signed it for
this node, now, once; isolation.py says where, as whom (job_user.py) and with what limits
it runs, and tracking.py follows and ends all of its processes (a cgroup, or the agent as
their subreaper; procfs.py reads /proc); process.py starts the command and ends it;
output.py relays its output to the edge over the control stream (seq, acks, cap); link.py
crosses between the runtime's asyncio thread and the stream's Trio loop.
The protocol is in docs/node-protocol.md, "Jobs".
"""

from oz0_node.jobs.attempt import ACTIVITY, RunningAttempts, attempt_activity
from oz0_node.jobs.link import OutputLink, StreamLink
from oz0_node.jobs.output import OUTPUT_CAP
from oz0_node.jobs.process import KILL_GRACE

__all__ = [
    "ACTIVITY",
    "KILL_GRACE",
    "OUTPUT_CAP",
    "OutputLink",
    "RunningAttempts",
    "StreamLink",
    "attempt_activity",
]
