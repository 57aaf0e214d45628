"""Jobs on the node: the `oz0.job.attempt` activity, the attempts' supervisors, and the
manager that follows them across control streams and agent restarts.

attempt.py takes one attempt, once grants.py has checked that the cluster signed it for
this node, now, once, and hands it to manager.py, which starts its supervisor
(supervisor.py: a process of its own that owns the command, its output file and its exit
status); isolation.py says where, as whom (job_user.py) and with what limits it runs, and
tracking.py follows and ends all of its processes (a cgroup, or the supervisor as their
subreaper; procfs.py reads /proc). The manager relays output and results to the edge over
whichever control stream is up (edge_link.py). The protocol is in docs/node-protocol.md,
"Jobs".
"""

from oz0_node.jobs.attempt import ACTIVITY, attempt_activity
from oz0_node.jobs.edge_link import EdgeLink
from oz0_node.jobs.output import OUTPUT_CAP
from oz0_node.jobs.process import KILL_GRACE

__all__ = [
    "ACTIVITY",
    "KILL_GRACE",
    "OUTPUT_CAP",
    "EdgeLink",
    "attempt_activity",
]
