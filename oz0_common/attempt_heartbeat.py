"""What every heartbeat of a node's attempt activity carries (`oz0.job.attempt`).

Temporal records an activity as started when it hands the task to a poll, and a poll's
answer can still be lost: under load the matching service gives up on recording the start
after a second (a sync match), while the history service may have recorded it; the task is
then dropped as a duplicate and no worker has it. The activity then times out on its
heartbeat like an attempt whose node was lost. Its heartbeats tell the two apart: the node
beats HEARD as soon as the attempt reaches its activity, and the edge beats HEARD for it
from then on, so a heartbeat timeout whose last heartbeat details are empty is an attempt
no node ever heard of, which the job's workflow gives to the node again
(oz0/jobs/workflow/_attempts.py, `unheard`)."""

HEARD = "heard"
