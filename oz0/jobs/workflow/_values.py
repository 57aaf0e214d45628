"""What crosses the job workflow's boundary: the names Temporal knows it and its steps by,
the error types nodes and steps fail with, and the values it is started with, its steps
return and its signals carry (JobInput, Placed, PartEnd, AttemptEnd, Finish), and how an
attempt ended (Outcome; why, an EndReason: oz0/jobs/end_reasons.py).

Each value is a payload in workflow histories: its name, its fields' names and their order
are what running workflows replay with; a field is only ever added, last, with a default.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from oz0.jobs.end_reasons import EndReason

JOBS_QUEUE = "oz0-jobs"
WORKFLOW = "oz0.job"
NODE_ACTIVITY = "oz0.job.attempt"
# The node's error type for an attempt it will not run (oz0_node/jobs/attempt.py).
ATTEMPT_REFUSED = "AttemptRefused"
# The node's error type for an attempt whose command it killed as its runtime stopped
# (its stream ended, the agent stopped): the command may have run part of the way.
NODE_STOPPING = "NodeStopping"
# The placing step's failure when its server cannot hand the job's secrets over: the job
# fails with its message. SECRETS_UNREADABLE: the node's, when they do not open with its
# key (renewed since they were sealed): the attempt moves, sealed again to the new key.
SECRETS_UNAVAILABLE = "SecretsUnavailable"
SECRETS_UNREADABLE = "SecretsUnreadable"
# The node's error type for an attempt it could not record as run (its data directory full
# or not writable; oz0_node/jobs/grants.py): not run, moved (JobInput.unrecorded).
RECORD_UNWRITABLE = "RecordUnwritable"
# With JobInput.watch_heard, the workflow asks Temporal (the step CHECK_HEARD, heard.py)
# about the attempts handed out that no node has been heard of yet (_attempts.py): one
# started a while ago with no heartbeat yet is failed by ID (UNHEARD) and so given again.
CHECK_HEARD, UNHEARD = "oz0.jobs.check_heard", "Unheard"
ON_LOST = ("move", "wait", "fail")
# The signal that tells a workflow its streamed attempts ended (a list of PartEnd).
PARTS_ENDED = "parts_ended"
# Workflows started before attempts had IDs of their own are lost after their heartbeat
# timeout (_attempts.py); from then on after the job's lost-after: LOST_AFTER[on_lost]
# unless it asks (the same defaults as oz0.jobs.spec_text's, which a test compares: the
# workflow imports no oz0 outside its package).
LOST_AFTER = {"move": 15.0, "wait": 600.0, "fail": 15.0}
# Why the node's copy of the command ended unseen, or may run on (Outcome.lost).
LOST, STOPPED = "lost", "stopped"
# A node that does not take its attempt by then has lost it (`schedule_to_start`).
SCHEDULE_TO_START = dt.timedelta(seconds=15)


@dataclass
class JobInput:
    job_id: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    timeout: float | None = None
    retries: int = 0
    all_nodes: bool = False
    no_move: bool = False
    queue_timeout: float = 600.0
    # Resource limits for each attempt (oz0/jobs/limits.py), passed to the node as asked.
    # Typed Any: temporalio converts to `int | float` by trying int first (cpu 0.5 -> 0).
    limits: dict[str, Any] = field(default_factory=dict)
    # When its attempt's node is lost: "move", "wait" or "fail"; after LOST_AFTER seconds
    # unheard of (None: LOST_AFTER[on_lost]). Defaults only: older histories replay.
    on_lost: str = "move"
    lost_after: float | None = None
    # A rolling batch (`--all --batch`): at most BATCH parts at once ("N", or "P%" of the
    # matching nodes), each slot idle BATCH_WAIT seconds after its part ends; no new part
    # once more than MAX_FAILURES ("N" or "P%") have failed. None: every part at once, as
    # every history before batches has it (defaults only: they replay unchanged).
    batch: str | None = None
    batch_wait: float = 0.0
    max_failures: str | None = None
    # The database steps as local activities: run by the worker that runs the workflow
    # task, their results recorded as markers when that task completes, so a step costs no
    # activity task round trip through Temporal (schedule, poll, start, complete, and a
    # workflow task to hear of it). At least once too, like the activities they replace:
    # each step is idempotent (activities.py). Set by the server that starts the workflow
    # once every server up is of a release that runs them (inputs.py):
    # a worker of an older one could not replay the history. False: ordinary activities,
    # as every workflow started before has them.
    local_steps: bool = False
    # Attempts no node has heard of are looked for HEARD_AFTER seconds after they are
    # handed out (`_attempts.watch_heard`). Set like local_steps (inputs.py), once every
    # server up has the step; False: as every workflow started before (they replay
    # unchanged).
    watch_heard: bool = False
    # The first attempt, placed (granted, its secrets sealed) by the server that started
    # the workflow, in the transaction that claimed the job (role.py): the workflow's first
    # task hands it out at once, no step before it. None: the workflow places it, as every
    # job whose node was not free then, every `--all` job and every workflow before it.
    first: Placed | None = None
    # Attempts placed on a node that takes them so are rows sent over its control stream
    # (Placed.streamed), their ends signalled (`parts_ended`). Set like local_steps
    # (inputs.py); False: every attempt an activity, as every workflow before.
    streamed: bool = False
    # An attempt its node could not record as run (RECORD_UNWRITABLE: its data directory
    # full) ends NODE_COULD_NOT_RECORD, not what became of its node. Set like local_steps
    # (inputs.py), once every server up knows that reason; False: as every workflow before.
    unrecorded: bool = False

    @property
    def lost_after_s(self) -> float:
        if self.lost_after is not None:
            return self.lost_after
        return LOST_AFTER.get(self.on_lost, LOST_AFTER["move"])


@dataclass(frozen=True)
class Placed:
    """Where attempt NUMBER (of part PART) runs, or (node None) why no node can take it
    now: placement.py's answer, granted and sealed by activities.py."""

    number: int
    node: str | None
    reason: str | None = None
    # The job ended meanwhile (cancelled before its first attempt): nothing to run.
    ended: bool = False
    part: int = 0
    # The attempt's grant, signed by the server that placed it: the node runs nothing else.
    grant: dict[str, str] | None = None
    # The job's secrets sealed to NODE's key for attempt NUMBER ("" for none): the
    # attempt's `secrets`, opaque here (oz0_common/sealed_env.py).
    secrets: str = ""
    # Sent to its node over the node's control stream, from its row (JobInput.streamed):
    # no activity; its end comes as the `parts_ended` signal (grant and secrets are in the
    # row only, so None and "" here). False in every history from before.
    streamed: bool = False


@dataclass
class PartEnd:
    """How a streamed attempt ended, as the edge recorded it from its node's report
    (oz0/jobs/parts.py): the same fields `_attempts.attempt_ends` makes of an activity's
    end."""

    number: int
    because: EndReason
    exit_code: int | None = None
    # Which node refused which attempt, and why (because REFUSED).
    refusal: str | None = None
    # LOST or STOPPED, as Outcome.lost.
    lost: str | None = None


@dataclass
class AttemptEnd:
    job_id: str
    number: int
    because: EndReason | None  # None: from what became of the node
    exit_code: int | None
    # What the node said it applied (its result's `applied`), checked by the store.
    applied: dict[str, Any] | None = None
    # The node's word on why it failed the attempt (its error's message), kept beside the
    # reason (job_attempts.ended_detail). A worker of an older release drops it unread.
    detail: str | None = None


@dataclass
class Finish:
    job_id: str
    state: str
    exit_code: int | None
    reason: str | None


class Heard:
    """What CHECK_HEARD says of an attempt (heard.py): its node has it (a heartbeat came),
    failed as UNHEARD just now, still in its node's queue or started too lately to tell,
    or gone (ended meanwhile)."""

    HEARD, FAILED, WAITING, GONE = "heard", "failed", "waiting", "gone"


@dataclass
class Outcome:
    because: EndReason
    exit_code: int | None
    # Which node refused which attempt, and why (because REFUSED).
    refusal: str | None = None
    # Why the node's copy of the command ended unseen, or may run on: LOST (no heartbeat
    # reached Temporal for the job's lost-after) or STOPPED (the node killed it as it
    # stopped); None when it did not start, or ended as it should (on_lost "fail": the
    # job ends lost rather than run it again elsewhere).
    lost: str | None = None
    # The job was cancelled while this attempt's end was being recorded: too late for the
    # attempt, which ended anyway; the job ends cancelled unless this attempt ended it.
    cancelled: bool = False

    @property
    def moved(self) -> bool:
        return self.because.moves


def schedule_to_start(all_nodes: bool, queue_timeout: float) -> dt.timedelta:
    """How long an attempt may wait on its node's queue: a part of an --all job is placed
    whether or not its node has a free slot, so it may wait there as long as the job may
    wait for a node. Its grant expires after that (oz0/jobs/grant.py)."""
    if all_nodes:
        return max(SCHEDULE_TO_START, dt.timedelta(seconds=queue_timeout))
    return SCHEDULE_TO_START
