"""The job's workflow: where each attempt runs, and what happens when it ends. Every caller
uses it as `from oz0.jobs.workflow import X`, X among the names below.

One workflow per job (its ID is the job's), in the tenant's namespace, on JOBS_QUEUE that
every server's job worker polls, so any server carries any job and a server's death loses
none. Each attempt is the node's activity `oz0.job.attempt` on the node's own task queue,
or a row sent over the node's control stream (Placed.streamed); Temporal retries none of
them (maximum_attempts 1): this workflow picks where the next one runs. An attempt ends
when:
- the command ends (exit or timeout): a failure counts against `retries`;
- its node is taken away: the sweeper signals `node_removed` (block, purge, delete), or
  the node never takes it (schedule-to-start), or the node is lost: no server heard from
  it for the job's lost-after (its heartbeat timeout; the node's attempt_alive messages
  reach Temporal through whichever server it streams to, oz0/server/edge/attempts.py).
  Then the attempt moves to another node, unless the job may not move (`no_move`, `all`),
  or, lost, its `on_lost` is `fail` (the job ends lost: at most once); `wait` is `move`
  with a longer default lost-after. Moves do not count against `retries`, but are capped
  at MAX_MOVES;
- its node refuses it (`AttemptRefused`: the grant placement signed does not hold there,
  docs/node-protocol.md): the job fails at once, neither retried nor moved, since the
  next node would refuse it the same way.
Whatever the activity returns later for an attempt the workflow has moved on from is
ignored.

The modules beside this one, each a concern, lowest first. They import only temporalio,
the standard library, each other and oz0/jobs/end_reasons.py (why an attempt ended: its
values carry it), and keep nothing in module globals but constants: the workers' sandbox
passes them through (oz0/jobs/role.py WORKFLOW_RUNNER; tests/test_workflow_modules.py
checks).

- `_values`: what crosses the workflow's boundary: the names of the workflow, its queue,
  its signals and the node's activity, the error types nodes and steps fail with, and the
  values it is started with, its steps return and its signals carry (JobInput, Placed,
  PartEnd, AttemptEnd, Finish), and an attempt's Outcome.
- `_steps`: the database steps as the workflow calls them (local activities or not), and
  how one is run to its end through a cancellation.
- `_state`: JobState, what one workflow knows as it runs (attempts taken away or ended,
  the latest attempt's number, the attempts no node was heard of yet).
- `_streamed`: one attempt sent over its node's control stream: its end waited for.
- `_attempts`: one attempt as the node's activity: handed out, given again while no node
  heard of it (`watch_heard`), and its end read and recorded.
- `_placing`: waiting queued until a placing step names a node; `Ended`.
- `_once`: a job on one node, moved and retried until it succeeds, fails or is lost.
- `_everywhere`: a job on every matching node (`--all`), and one node's part of it.
- `_batches`: `--all --batch`: the parts a few at a time, stopped by `--max-failures`.
- `_job`: JobWorkflow itself: its signals, which of those runs the job, its end recorded.
"""

from oz0.jobs.workflow._attempts import (
    ATTEMPT_BY_ID,
    HEARD_AFTER,
    HEARD_CHECKS,
    HEARTBEAT_TIMEOUT,
    NO_TIMEOUT,
    REDELIVER,
    REDELIVER_MAX,
    TIMEOUT_MARGIN,
)
from oz0.jobs.workflow._batches import share_of
from oz0.jobs.workflow._job import JobWorkflow
from oz0.jobs.workflow._once import MAX_MOVES
from oz0.jobs.workflow._placing import (
    QUEUED_BACKOFF,
    QUEUED_PATIENT,
    QUEUED_POLL_FIRST,
    QUEUED_POLL_LONGEST,
    QUEUED_POLL_MAX,
    QUEUED_SHARE,
    queued_pause,
)
from oz0.jobs.workflow._state import JobState
from oz0.jobs.workflow._steps import STEP, STEP_RETRY
from oz0.jobs.workflow._values import (
    ATTEMPT_REFUSED,
    CHECK_HEARD,
    JOBS_QUEUE,
    LOST,
    LOST_AFTER,
    NODE_ACTIVITY,
    NODE_STOPPING,
    ON_LOST,
    PARTS_ENDED,
    RECORD_UNWRITABLE,
    SCHEDULE_TO_START,
    SECRETS_UNAVAILABLE,
    SECRETS_UNREADABLE,
    STOPPED,
    UNHEARD,
    WORKFLOW,
    AttemptEnd,
    Finish,
    Heard,
    JobInput,
    Outcome,
    PartEnd,
    Placed,
    schedule_to_start,
)

__all__ = [
    "ATTEMPT_BY_ID",
    "ATTEMPT_REFUSED",
    "CHECK_HEARD",
    "HEARD_AFTER",
    "HEARD_CHECKS",
    "HEARTBEAT_TIMEOUT",
    "JOBS_QUEUE",
    "LOST",
    "LOST_AFTER",
    "MAX_MOVES",
    "NODE_ACTIVITY",
    "NODE_STOPPING",
    "NO_TIMEOUT",
    "ON_LOST",
    "PARTS_ENDED",
    "QUEUED_BACKOFF",
    "QUEUED_PATIENT",
    "QUEUED_POLL_FIRST",
    "QUEUED_POLL_LONGEST",
    "QUEUED_POLL_MAX",
    "QUEUED_SHARE",
    "RECORD_UNWRITABLE",
    "REDELIVER",
    "REDELIVER_MAX",
    "SCHEDULE_TO_START",
    "SECRETS_UNAVAILABLE",
    "SECRETS_UNREADABLE",
    "STEP",
    "STEP_RETRY",
    "STOPPED",
    "TIMEOUT_MARGIN",
    "UNHEARD",
    "WORKFLOW",
    "AttemptEnd",
    "Finish",
    "Heard",
    "JobInput",
    "JobState",
    "JobWorkflow",
    "Outcome",
    "PartEnd",
    "Placed",
    "queued_pause",
    "schedule_to_start",
    "share_of",
]
