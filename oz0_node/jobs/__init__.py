"""Jobs on the node: the `oz0.job.attempt` activity and the relay of its output.

attempt.py runs one attempt as a process group in a fresh directory, once grants.py has
checked that the cluster signed it for this node, now, once; output.py relays its
output to the edge over the control stream (seq, acks, cap); link.py crosses between the
runtime's asyncio thread and the stream's Trio loop; process.py starts and ends its process group.
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
