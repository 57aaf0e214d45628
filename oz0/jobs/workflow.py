"""The job's workflow: where each attempt runs, and what happens when it ends.

One workflow per job (its ID is the job's), in the tenant's namespace, on JOBS_QUEUE that
every server's job worker polls, so any server carries any job and a server's death loses
none. Each attempt is the node's activity `oz0.job.attempt` on the node's own task queue;
Temporal retries none of them (maximum_attempts 1): this workflow picks where the next one
runs. An attempt ends when:
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
ignored. Only temporalio and the standard library are imported here (the sandbox).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    FailureError,
    TimeoutError,
    TimeoutType,
    is_cancelled_exception,
)

T = TypeVar("T")

JOBS_QUEUE = "oz0-jobs"
WORKFLOW = "oz0.job"
NODE_ACTIVITY = "oz0.job.attempt"
# The node's error type for an attempt it will not run (oz0_node/jobs/attempt.py).
ATTEMPT_REFUSED = "AttemptRefused"
# The node's error type for an attempt whose command it killed as its runtime stopped
# (its stream ended, the agent stopped): the command may have run part of the way.
NODE_STOPPING = "NodeStopping"
MAX_MOVES = 20
# The placing step's failure when its server cannot hand the job's secrets over: the job
# fails with its message. SECRETS_UNREADABLE: the node's, when they do not open with its
# key (renewed since they were sealed): the attempt moves, sealed again to the new key.
SECRETS_UNAVAILABLE = "SecretsUnavailable"
SECRETS_UNREADABLE = "SecretsUnreadable"
# A node that does not take its attempt by then has lost it.
SCHEDULE_TO_START = dt.timedelta(seconds=15)
# Workflows started before attempts had IDs of their own heartbeat on the node's own
# Temporal connection and are lost after HEARTBEAT_TIMEOUT; from ATTEMPT_BY_ID on, each
# attempt is the activity `attempt-N`, heartbeated by ID by the server its node streams
# to, and lost after the job's lost-after: LOST_AFTER[on_lost] unless it asks (the same
# defaults as oz0.jobs.spec_text's, which a test compares: this module imports no oz0).
HEARTBEAT_TIMEOUT = dt.timedelta(seconds=10)
ATTEMPT_BY_ID = "oz0-attempt-by-id"
# An attempt whose activity timed out with no heartbeat at all (no node heard of it) is
# given to its node again, at most REDELIVER_MAX times (`_unheard`); histories from before
# (no REDELIVER marker) end it lost, as they did.
REDELIVER, REDELIVER_MAX = "oz0-redeliver-unheard", 2
# With JobInput.watch_heard, the workflow asks Temporal (the step CHECK_HEARD, heard.py)
# about each attempt HEARD_AFTER seconds after handing it out, and every HEARD_AFTER while
# it waits in its node's queue: one started that long ago with no heartbeat yet is failed
# by ID (UNHEARD) and so given again at once, not after the attempt's lost-after.
# An attempt still in its node's queue is asked about at most HEARD_CHECKS times (a long
# queue costs no more events than that): its heartbeat timeout is the sign after.
CHECK_HEARD, UNHEARD, HEARD_AFTER, HEARD_CHECKS = "oz0.jobs.check_heard", "Unheard", 5.0, 3
ON_LOST = ("move", "wait", "fail")
# The signal that tells a workflow its streamed attempts ended (a list of PartEnd), and the
# reason a streamed attempt's node fell silent for its lost-after (the sweeper's).
PARTS_ENDED, NODE_LOST = "parts_ended", "node lost"
LOST_AFTER = {"move": 15.0, "wait": 600.0, "fail": 15.0}
# No job timeout: heartbeats alone keep the attempt honest.
NO_TIMEOUT = dt.timedelta(days=365)
TIMEOUT_MARGIN = dt.timedelta(seconds=60)
# While no node can take the job: look again after 1 s, doubling up to QUEUED_POLL_MAX;
# once it has waited QUEUED_PATIENT, after a tenth of its wait so far, up to
# QUEUED_POLL_LONGEST (reached at 5 minutes), so that thousands of queued jobs do not ask
# the database every 5 s (`queued_pause`). Workflows that began waiting before this backoff
# (no QUEUED_BACKOFF marker in their history) keep the 5 s their history was made with.
QUEUED_POLL_FIRST, QUEUED_POLL_MAX = 1.0, 5.0
QUEUED_PATIENT, QUEUED_POLL_LONGEST, QUEUED_SHARE = 60.0, 30.0, 0.1
QUEUED_BACKOFF = "oz0-queued-backoff"
STEP = dt.timedelta(seconds=10)
# The database's outages are waited out: a step retried for as long as it takes.
STEP_RETRY = RetryPolicy(
    initial_interval=dt.timedelta(seconds=0.5), maximum_interval=dt.timedelta(seconds=5)
)


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
    # handed out (`_watch_heard`). Set like local_steps (inputs.py), once every server up
    # has the step; False: as every workflow started before (they replay unchanged).
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

    @property
    def lost_after_s(self) -> float:
        if self.lost_after is not None:
            return self.lost_after
        return LOST_AFTER.get(self.on_lost, LOST_AFTER["move"])


def share_of(share: str, total: int, *, least: int) -> int:
    """SHARE ("N" or "P%", as oz0.jobs.spec_text.parse_share keeps it) of TOTAL parts, at
    least LEAST: a percentage rounds down, as Salt's `--batch 10%` does."""
    if share.endswith("%"):
        return max(least, total * int(share[:-1]) // 100)
    return max(least, int(share))


def schedule_to_start(all_nodes: bool, queue_timeout: float) -> dt.timedelta:
    """How long an attempt may wait on its node's queue: a part of an --all job is placed
    whether or not its node has a free slot, so it may wait there as long as the job may
    wait for a node. Its grant expires after that (oz0/jobs/grant.py)."""
    if all_nodes:
        return max(SCHEDULE_TO_START, dt.timedelta(seconds=queue_timeout))
    return SCHEDULE_TO_START


@dataclass
class Placed:
    number: int
    node: str | None
    reason: str | None = None
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
    (oz0/jobs/parts.py): the same fields `_attempt_ends` makes of an activity's end."""

    number: int
    because: str
    exit_code: int | None = None
    # Which node refused which attempt, and why (because "refused").
    refusal: str | None = None
    # LOST or STOPPED, as Outcome.lost.
    lost: str | None = None


@dataclass
class AttemptEnd:
    job_id: str
    number: int
    because: str | None  # None: from what became of the node
    exit_code: int | None
    # What the node said it applied (its result's `applied`), checked by the store.
    applied: dict[str, Any] | None = None


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
    because: str
    exit_code: int | None
    # Which node refused which attempt, and why (because "refused").
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
        return self.because.startswith("node ")


class _Ended(Exception):
    """The job cannot go on: STATE, with REASON (and the exit code, if any)."""

    def __init__(self, state: str, reason: str | None, exit_code: int | None = None) -> None:
        super().__init__(reason)
        self.state, self.reason, self.exit_code = state, reason, exit_code


@workflow.defn(name=WORKFLOW)
class JobWorkflow:
    def __init__(self) -> None:
        self.removed: dict[int, str] = {}
        self.ended: dict[int, PartEnd] = {}
        self.number = 0
        # A cancellation came that an attempt's end, being recorded, held off (`_whole`):
        # no part starts after it.
        self.cancel_heard = False
        # Attempts handed out that no node is known to have yet, and what looks for them
        # (`_watch_heard`, started with the first of them).
        self.unconfirmed: dict[int, int] = {}  # attempt -> times asked about
        self.watcher: asyncio.Task[None] | None = None
        self.checking = False

    @workflow.signal(name="node_removed")
    def node_removed(self, number: int, because: str) -> None:
        self.removed.setdefault(number, because)

    @workflow.signal(name=PARTS_ENDED)
    def parts_ended(self, ends: list[PartEnd]) -> None:
        """Streamed attempts that ended (the edge that stored their nodes' reports, or the
        sweeper for one whose signal was lost): the first word on each stands."""
        for end in ends:
            self.ended.setdefault(end.number, end)

    @workflow.run
    async def run(self, job: JobInput) -> str:
        try:
            if job.all_nodes and job.batch is not None:
                state, exit_code, reason = await self._in_batches(job)
            elif job.all_nodes:
                state, exit_code, reason = await self._everywhere(job)
            else:
                state, exit_code, reason = await self._once(job)
        except _Ended as e:
            state, exit_code, reason = e.state, e.exit_code, e.reason
        except (asyncio.CancelledError, FailureError) as e:
            # A cancellation that comes while a step runs (placing, recording an end) is
            # that step's failure (an ActivityError; a local activity's own CancelledError
            # or ApplicationError), not an asyncio.CancelledError.
            unavailable = _secrets_unavailable(e)
            if unavailable is not None:
                state, exit_code, reason = "failed", None, unavailable
            elif not is_cancelled_exception(e):
                raise
            else:
                state, exit_code, reason = "cancelled", None, "cancelled by an operator"
        if self.watcher is not None and self.checking:
            # A check under way would hold the job's last workflow task open; its answer
            # no longer matters. A watcher waiting on its timer is left: the timer goes
            # with the workflow, where cancelling it would be one more event.
            self.watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError, FailureError):
                await self.watcher
        finish = Finish(job.job_id, state, exit_code, reason)
        await _unstoppable(_step("oz0.jobs.finish", finish, local=job.local_steps))
        return state

    # --- one command, moved until it ends -------------------------------------------------

    async def _once(self, job: JobInput) -> tuple[str, int | None, str | None]:
        tried: list[str] = []
        failures = moves = 0
        first = job.first if job.first is not None and job.first.node is not None else None
        while True:
            if first is not None:
                placed, first = first, None
                self.number = placed.number
            else:
                placed = await self._place(job, tried)
            assert placed.node is not None
            outcome = await self._attempt(job, placed)
            if outcome.because == "exit" and outcome.exit_code == 0:
                return "succeeded", 0, None
            if outcome.refusal is not None:
                return "failed", None, outcome.refusal
            if outcome.lost is not None and job.on_lost == "fail":
                return "lost", None, _lost(outcome.lost, placed, job)
            if outcome.cancelled:
                return "cancelled", None, "cancelled by an operator"
            tried.append(placed.node)
            if outcome.moved:
                if job.no_move:
                    return "lost", None, f"attempt {placed.number}: {outcome.because} (--no-move)"
                moves += 1
                if moves > MAX_MOVES:
                    return "lost", None, f"moved {MAX_MOVES} times; last: {outcome.because}"
                continue
            failures += 1
            if failures > job.retries:
                return "failed", outcome.exit_code, _failed(outcome, job)

    async def _place(self, job: JobInput, tried: list[str]) -> Placed:
        """The next attempt's node; waits (queued) while none can take it."""
        self.number += 1
        number = self.number

        async def place() -> list[Placed]:
            return [
                await _step(
                    "oz0.jobs.place", job.job_id, number, 0, tried,
                    result_type=Placed, local=job.local_steps,
                )
            ]  # fmt: skip

        [placed] = await _until_placed(
            job,
            place,
            f"no node took the job within its queue timeout of {job.queue_timeout:g} s",
        )
        return placed

    # --- once on every matching node --------------------------------------------------------

    async def _everywhere(self, job: JobInput) -> tuple[str, int | None, str | None]:
        async def place() -> list[Placed]:
            placed: list[Placed] = await _step(
                "oz0.jobs.place_everywhere", job.job_id, 1,
                result_type=list[Placed], local=job.local_steps,
            )  # fmt: skip
            return placed

        placed = await _until_placed(
            job, place, f"no node matched within the queue timeout of {job.queue_timeout:g} s"
        )
        self.number = len(placed)
        parts = [asyncio.create_task(self._part(job, p)) for p in placed]
        try:
            results = await asyncio.gather(*parts)
        except asyncio.CancelledError:
            for task in parts:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*parts, return_exceptions=True)
            # Too late if every part had ended anyway (as for one node, `_whole`): the
            # workflow task run again with the cancel first must end the job the same way.
            if not (job.local_steps and all(map(_ended_anyway, parts))):
                raise
            results = [task.result() for task in parts]
        failed = [r for r in results if not r.moved and r.exit_code != 0]
        lost = [r for r in results if r.moved]
        if failed:
            first = failed[0]
            why = f"{len(failed)} of {len(results)} nodes failed"
            refused = [r.refusal for r in results if r.refusal is not None]
            if refused:
                why += f" ({refused[0]})"
            return "failed", first.exit_code, why
        if lost:
            return (
                "lost",
                None,
                f"{len(lost)} of {len(results)} nodes were lost ({lost[0].because})",
            )
        return "succeeded", 0, None

    # --- on every matching node, a few at a time (--batch) -------------------------------

    async def _in_batches(self, job: JobInput) -> tuple[str, int | None, str | None]:
        """Salt's `--batch` as a sliding window: the parts (one per node matching now) are
        recorded waiting; WINDOW lanes each take the next waiting part, run it to its end,
        rest `batch_wait`, and take the next, so at most WINDOW run at once and a part
        starts as soon as one ends. Once more than `max_failures` parts have failed, no
        lane takes another; those running finish. Only workflow timers and the lanes'
        own state decide, so a replay makes the same steps."""
        assert job.batch is not None

        async def listed() -> list[Placed]:
            parts: list[Placed] = await _step(
                "oz0.jobs.list_parts", job.job_id, result_type=list[Placed], local=job.local_steps
            )
            return parts

        waiting = await _until_placed(
            job, listed, f"no node matched within the queue timeout of {job.queue_timeout:g} s"
        )
        total = len(waiting)
        window = share_of(job.batch, total, least=1)
        allowed = None if job.max_failures is None else share_of(job.max_failures, total, least=0)
        self.number = total  # first attempts are 1..total; retries number on from there
        results: list[Outcome] = []

        def stopped() -> bool:
            return allowed is not None and sum(map(_part_failed, results)) > allowed

        async def lane() -> None:
            while waiting and not stopped() and not self.cancel_heard:
                results.append(await self._waited_part(job, waiting.pop(0)))
                if job.batch_wait > 0 and waiting and not stopped() and not self.cancel_heard:
                    await workflow.sleep(job.batch_wait)

        lanes = [asyncio.create_task(lane()) for _ in range(min(window, total))]
        try:
            await asyncio.gather(*lanes)
        except BaseException as e:
            # Cancelled, or a step that failed the job: no lane goes on without the job.
            for task in lanes:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*lanes, return_exceptions=True)
            # Too late if every part had ended anyway (as in `_everywhere`).
            ended_anyway = (
                isinstance(e, asyncio.CancelledError) and job.local_steps and not waiting
                and all(t.done() and not t.cancelled() and t.exception() is None for t in lanes)
                and not any(r.cancelled for r in results)
            )  # fmt: skip
            if not ended_anyway:
                raise
        return _verdict(results, total, len(waiting), job)

    async def _waited_part(self, job: JobInput, part: Placed) -> Outcome:
        """PART, its slot open: its first attempt placed now (grant and secrets from now),
        then run as any part; a node taken away while the part waited ends it unrun."""
        assert part.node is not None
        placed: Placed = await _step(
            "oz0.jobs.place_part", job.job_id, part.number, part.part, part.node,
            result_type=Placed, local=job.local_steps,
        )  # fmt: skip
        if placed.ended:
            raise _Ended("cancelled", "cancelled by an operator")
        if placed.node is None:
            return Outcome(placed.reason or "node lost", None)
        return await self._part(job, placed)

    async def _part(self, job: JobInput, first: Placed) -> Outcome:
        """One node's part of an `--all` job: retried there, never moved."""
        assert first.node is not None
        number, failures, placed = first.number, 0, first
        while True:
            outcome = await self._attempt(job, placed)
            self.cancel_heard |= outcome.cancelled
            # A part's end as it would be without a cancellation is its end: `cancelled`
            # stays only on one that a cancellation cut short (a retry not made).
            if outcome.moved or outcome.refusal is not None:
                return dataclasses.replace(outcome, cancelled=False)
            if outcome.because == "exit" and outcome.exit_code == 0:
                return dataclasses.replace(outcome, cancelled=False)
            failures += 1
            if failures > job.retries:
                return dataclasses.replace(outcome, cancelled=False)
            if outcome.cancelled:
                return outcome
            self.number += 1
            number = self.number
            placed = await _step(
                "oz0.jobs.place_on",
                job.job_id,
                number,
                first.part,
                first.node,
                result_type=Placed,
                local=job.local_steps,
            )

    # --- attempts no node heard of ---------------------------------------------------------

    def _watch(self, job: JobInput, number: int) -> None:
        """Attempt NUMBER was just handed out: looked for within HEARD_AFTER."""
        if not job.watch_heard:
            return
        self.unconfirmed[number] = 0
        if self.watcher is None:
            self.watcher = asyncio.create_task(self._watch_heard(job))

    async def _watch_heard(self, job: JobInput) -> None:
        """While some attempt is unconfirmed: HEARD_AFTER later, ask Temporal about each
        (CHECK_HEARD, which fails by ID those started that long ago with no heartbeat: the
        attempt's own wait in `_attempt` then gives it again). One timer and one step for
        all the job's parts; none at all after the job ends within HEARD_AFTER."""
        run_id = workflow.info().run_id
        while True:
            await workflow.wait_condition(lambda: bool(self.unconfirmed))
            await workflow.sleep(HEARD_AFTER)
            asked = sorted(self.unconfirmed)
            if not asked:
                continue
            self.checking = True
            try:
                said: dict[str, str] = await _step(
                    CHECK_HEARD, job.job_id, run_id, asked, HEARD_AFTER,
                    result_type=dict[str, str], local=job.local_steps,
                )  # fmt: skip
            finally:
                self.checking = False
            for n in asked:
                if n not in self.unconfirmed:
                    continue  # ended meanwhile
                self.unconfirmed[n] += 1
                if said.get(str(n)) == Heard.HEARD or self.unconfirmed[n] >= HEARD_CHECKS:
                    del self.unconfirmed[n]

    # --- one attempt ---------------------------------------------------------------------

    async def _attempt(self, job: JobInput, placed: Placed) -> Outcome:
        """Run PLACED's attempt on its node (with the grant its placement signed and the
        secrets it sealed to that node) until it ends, its node is taken away, or the job
        is cancelled; its end is recorded before this returns."""
        if placed.streamed:
            return await self._streamed(job, placed)
        number, node = placed.number, placed.node
        assert node is not None
        timeout = job.timeout
        attempt: dict[str, Any] = {
            "job_id": job.job_id,
            "attempt": number,
            "command": job.command,
            "env": job.env,
            "timeout": timeout,
            "grant": placed.grant,
        }
        if job.limits:  # only when asked: an older node ignores what it does not know
            attempt["limits"] = job.limits
        if placed.secrets:  # one opaque string, as the node protocol has it
            attempt["secrets"] = placed.secrets
        # Replayed, a history from before attempts had IDs of their own keeps its own.
        by_id = workflow.patched(ATTEMPT_BY_ID)
        handle = _node_activity(job, attempt, node, by_id=by_id)
        if by_id:
            self._watch(job, number)
        try:
            return await self._attempt_ends(job, placed, attempt, handle, by_id)
        finally:
            self.unconfirmed.pop(number, None)

    async def _streamed(self, job: JobInput, placed: Placed) -> Outcome:
        """PLACED's attempt, a row its node's edge sends over the control stream: until
        its end is signalled (`parts_ended`, recorded already), its node is taken away or
        lost (`node_removed`, recorded here), or the job is cancelled. No activity, no
        timer: what happens to the part happens in rows, and only its end is heard."""
        number = placed.number
        try:
            await workflow.wait_condition(lambda: number in self.ended or number in self.removed)
        except asyncio.CancelledError:
            if number in self.ended:  # its end came with the cancellation: too late for it
                return _part_outcome(self.ended[number], cancelled=True)
            # The node hears of it from its edge, which reads the attempt ended so.
            await _end(job, AttemptEnd(job.job_id, number, "cancelled", None))
            raise
        if number in self.ended:
            return _part_outcome(self.ended[number])
        removed = self.removed[number]
        because, late = await _whole(job, _end(job, AttemptEnd(job.job_id, number, removed, None)))
        if because != removed:
            # Its node's report was recorded first (the first end stands): its signal,
            # from the edge or the sweeper, says how it ended.
            await workflow.wait_condition(lambda: number in self.ended)
            return _part_outcome(self.ended[number], cancelled=late)
        return Outcome(because, None, lost=LOST if because == NODE_LOST else None, cancelled=late)

    async def _attempt_ends(
        self,
        job: JobInput,
        placed: Placed,
        attempt: dict[str, Any],
        handle: workflow.ActivityHandle[dict[str, Any]],
        by_id: bool,
    ) -> Outcome:
        number, node = placed.number, placed.node
        assert node is not None
        removal = asyncio.create_task(workflow.wait_condition(lambda: number in self.removed))
        # A cancellation that comes with the node's answer (in the same workflow task) is
        # too late for the attempt: its answer stands, recorded as `_whole` records it.
        late = False
        given = 1
        while True:
            try:
                await workflow.wait([handle, removal], return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                late = handle.done() and job.local_steps
                if not late:
                    handle.cancel()
                    removal.cancel()
                    with contextlib.suppress(ActivityError, asyncio.CancelledError):
                        await handle  # its cancellation, heard (else temporalio logs it lost)
                    await _end(
                        job, AttemptEnd(job.job_id, number, "cancelled", None), cancelled=True
                    )
                    raise
            if not handle.done():
                # Taken away: whatever the node says later is not heard.
                handle.cancel()
                with contextlib.suppress(ActivityError, asyncio.CancelledError):
                    await handle
                because = await _end(
                    job, AttemptEnd(job.job_id, number, self.removed[number], None), cancelled=True
                )
                return Outcome(because, None)
            # Lost on the way (oz0_common/attempt_heartbeat.py): not a node lost, the same
            # attempt (its grant, its activity ID) given to it again, a bounded number of
            # times; a node that runs it already starts nothing (its end completes this
            # activity), and its record of what it ran refuses one it had run and reported.
            if not (
                by_id and given <= REDELIVER_MAX and not late and _unheard(handle)
                and workflow.patched(REDELIVER)
            ):  # fmt: skip
                break
            given += 1
            workflow.logger.warning(
                "job %s attempt %d: no node heard of it; given to %s again",
                job.job_id, number, node,
            )  # fmt: skip
            handle = _node_activity(job, attempt, node, by_id=by_id)
            self._watch(job, number)
        removal.cancel()
        try:
            result = handle.result()
        except ActivityError as e:
            refusal = _refusal(e)
            if refusal is not None:
                because, later = await _whole(
                    job, _end(job, AttemptEnd(job.job_id, number, "refused", None))
                )
                return Outcome(
                    because, None, f"node {node} refused attempt {number}: {refusal}",
                    cancelled=late or later,
                )  # fmt: skip
            because, later = await _whole(
                job, _end(job, AttemptEnd(job.job_id, number, _failure_because(e), None))
            )
            return Outcome(because, None, lost=_lost_how(e), cancelled=late or later)
        ended_because = "timeout" if result.get("ended_because") == "timeout" else "exit"
        exit_code = result.get("exit_code")
        code = exit_code if isinstance(exit_code, int) else None
        applied = result.get("applied")
        because, later = await _whole(
            job,
            _end(
                job,
                AttemptEnd(
                    job.job_id, number, ended_because, code,
                    applied if isinstance(applied, dict) else None,
                )
            )
        )  # fmt: skip
        return Outcome(because, code, cancelled=late or later)


def _part_outcome(end: PartEnd, *, cancelled: bool = False) -> Outcome:
    return Outcome(end.because, end.exit_code, end.refusal, end.lost, cancelled)


def _part_failed(outcome: Outcome) -> bool:
    """A part that ran and failed (not one whose node was taken away)."""
    return not outcome.moved and outcome.exit_code != 0


def _verdict(
    results: list[Outcome], total: int, not_started: int, job: JobInput
) -> tuple[str, int | None, str | None]:
    """A batch job's end from its parts' RESULTS, of TOTAL, NOT_STARTED of which never
    started (stopped by --max-failures): failed if any failed, else lost if any node was
    taken away, else succeeded."""
    failed = [r for r in results if _part_failed(r)]
    lost = [r for r in results if r.moved]
    if failed:
        why = f"{len(failed)} of {total} nodes failed"
        refused = [r.refusal for r in results if r.refusal is not None]
        if refused:
            why += f" ({refused[0]})"
        if not_started:
            why += f"; {not_started} parts not started (--max-failures {job.max_failures})"
        return "failed", failed[0].exit_code, why
    if lost:
        return "lost", None, f"{len(lost)} of {total} nodes were lost ({lost[0].because})"
    return "succeeded", 0, None


def _ended_anyway(part: asyncio.Task[Outcome]) -> bool:
    """Whether PART's task ended with the part's own end, which a cancellation that came
    with it or as it was recorded did not cut short."""
    if not part.done() or part.cancelled() or part.exception() is not None:
        return False
    return not part.result().cancelled


async def _until_placed(
    job: JobInput, place: Callable[[], Awaitable[list[Placed]]], too_long: str
) -> list[Placed]:
    """PLACE until it names a node; between tries the job waits queued (`queued_pause`)
    until its queue timeout fails it with TOO_LONG and the last reason."""
    waited, delay = 0.0, QUEUED_POLL_FIRST
    # A marker in the history: replaying a workflow from before the backoff, this is False
    # and its timers are the ones it started; every workflow after it waits longer.
    backs_off = workflow.patched(QUEUED_BACKOFF)
    while True:
        placed = await place()
        if placed[0].ended:
            raise _Ended("cancelled", "cancelled by an operator")
        if placed[0].node is not None:
            return placed
        if waited >= job.queue_timeout:
            raise _Ended("failed", f"{too_long}: {placed[0].reason}")
        pause = min(queued_pause(waited, delay) if backs_off else delay, job.queue_timeout - waited)
        await workflow.sleep(pause)
        waited += pause
        delay = min(2 * delay, QUEUED_POLL_MAX)


def _node_activity(
    job: JobInput, attempt: dict[str, Any], node: str, *, by_id: bool
) -> workflow.ActivityHandle[dict[str, Any]]:
    """ATTEMPT's activity on NODE's queue."""
    timeout = job.timeout
    return workflow.start_activity(
        NODE_ACTIVITY,
        attempt,
        activity_id=f"attempt-{attempt['attempt']}" if by_id else None,
        task_queue=node,
        schedule_to_start_timeout=schedule_to_start(job.all_nodes, job.queue_timeout),
        start_to_close_timeout=(
            dt.timedelta(seconds=timeout) + TIMEOUT_MARGIN if timeout else NO_TIMEOUT
        ),
        heartbeat_timeout=(dt.timedelta(seconds=job.lost_after_s) if by_id else HEARTBEAT_TIMEOUT),
        retry_policy=RetryPolicy(maximum_attempts=1),
        cancellation_type=workflow.ActivityCancellationType.TRY_CANCEL,
        result_type=dict,
    )


def _unheard(handle: workflow.ActivityHandle[dict[str, Any]]) -> bool:
    """Whether HANDLE's activity timed out on its heartbeat with no heartbeat ever, or was
    failed as UNHEARD (`_watch_heard`): its task never reached a node
    (oz0_common/attempt_heartbeat.py)."""
    if handle.cancelled():
        return False
    error = handle.exception()
    if not isinstance(error, ActivityError):
        return False
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type == UNHEARD:
        return True
    return (
        isinstance(cause, TimeoutError)
        and cause.type == TimeoutType.HEARTBEAT
        and not cause.last_heartbeat_details
    )


def queued_pause(waited: float, delay: float) -> float:
    """How long a job that has waited WAITED seconds for a node waits before it looks again:
    DELAY (1 s doubling up to QUEUED_POLL_MAX) for its first QUEUED_PATIENT, as responsive as
    ever; then a tenth (QUEUED_SHARE) of its wait so far, from QUEUED_POLL_MAX up to
    QUEUED_POLL_LONGEST."""
    if waited < QUEUED_PATIENT:
        return delay
    return min(QUEUED_POLL_LONGEST, max(QUEUED_POLL_MAX, waited * QUEUED_SHARE))


def _failure_because(error: ActivityError) -> str | None:
    """Why the node's activity failed: the job's own timeout, or None when only what became
    of the node can tell (its runtime stopped, it fell silent, it never took the attempt)."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.START_TO_CLOSE:
        return "timeout"
    if isinstance(cause, ApplicationError) and cause.type == SECRETS_UNREADABLE:
        return "node could not read secrets"  # a move: placed again, sealed again
    return None


LOST, STOPPED = "lost", "stopped"


def _lost_how(error: ActivityError) -> str | None:
    """LOST if no heartbeat reached Temporal for the attempt's heartbeat timeout (its node
    was connected to no server, or its attempt gone from it); STOPPED if the node killed
    the command as its runtime stopped; else None."""
    cause = error.cause
    if isinstance(cause, TimeoutError) and cause.type == TimeoutType.HEARTBEAT:
        return LOST
    if isinstance(cause, ApplicationError) and cause.type == UNHEARD:
        return LOST  # as its heartbeat timeout would have, only sooner
    if isinstance(cause, ApplicationError) and cause.type == NODE_STOPPING:
        return STOPPED
    return None


def _lost(how: str, placed: Placed, job: JobInput) -> str:
    """The reason of a job ended lost by `--on-lost fail`."""
    if how == STOPPED:
        return (
            f"node {placed.node} stopped attempt {placed.number} before its end"
            " (--on-lost fail: not run again)"
        )
    return f"node {placed.node} was lost for more than {job.lost_after_s:g} s (--on-lost fail)"


def _secrets_unavailable(error: BaseException) -> str | None:
    """The message of a placing step that could not hand the job's secrets over (an
    activity's failure has it as its cause; a local activity's is raised as it is)."""
    cause = error.cause if isinstance(error, ActivityError) else error
    if isinstance(cause, ApplicationError) and cause.type == SECRETS_UNAVAILABLE:
        return f"cannot give the job's secrets to a node: {cause.message}"
    return None


def _refusal(error: ActivityError) -> str | None:
    """The node's reason, if it refused the attempt (its grant did not hold there)."""
    cause = error.cause
    if isinstance(cause, ApplicationError) and cause.type == ATTEMPT_REFUSED:
        return cause.message
    return None


def _failed(outcome: Outcome, job: JobInput) -> str:
    if outcome.because == "timeout":
        return f"timed out after {job.timeout:g} s"
    return f"exited with {outcome.exit_code}"


async def _end(job: JobInput, end: AttemptEnd, *, cancelled: bool = False) -> str:
    """Record END. CANCELLED: the attempt's node activity was just asked to stop; that
    request reaches Temporal (and the node) only with the workflow task that made it,
    which a local activity would hold open until it ends (and the steps after it, up to
    the job's finish): recorded as an ordinary activity instead, the request goes out
    at once, with it."""
    because: str = await _step(
        "oz0.jobs.end_attempt", end, result_type=str, local=job.local_steps and not cancelled
    )
    return because


async def _whole(job: JobInput, work: Awaitable[T]) -> tuple[T, bool]:
    """WORK (recording an attempt's end) run to its end even if the job is cancelled
    meanwhile, and whether it was: the caller decides, once the end is recorded, whether
    the cancellation still matters. A cancellation must not be decided by when it came
    during the steps that end a job: the workflow task that ran them and completes the
    workflow is refused when an event (this cancellation) came meanwhile, and run again
    with the cancellation first, its steps again (local activities), and it must end the
    job the same way. Workflows whose steps are activities cancel the step (as ever)."""
    if not job.local_steps:
        return await work, False
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            return await asyncio.shield(task), cancelled
        except asyncio.CancelledError:
            if task.cancelled():  # the worker tears the workflow down (eviction)
                raise
            cancelled = True


async def _unstoppable(work: Awaitable[T]) -> T:
    """WORK, run to its end even if the job is cancelled meanwhile (too late to matter):
    cancelled, a step is given up, and a job whose end is never recorded runs forever."""
    task = asyncio.ensure_future(work)
    while True:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.cancelled():  # the worker tears the workflow down (eviction)
                raise


# RESULT_TYPE: a type, or a union of types (temporalio converts to either).
async def _step(name: str, *args: object, result_type: Any = None, local: bool = False) -> Any:
    """A step that touches the database, on the servers' job workers: a local activity of
    the worker running the workflow if LOCAL (the job's local_steps), else an activity
    on JOBS_QUEUE."""
    if local:
        return await workflow.execute_local_activity(
            name,
            args=list(args),
            result_type=result_type,
            start_to_close_timeout=STEP,
            retry_policy=STEP_RETRY,
        )
    return await workflow.execute_activity(
        name,
        args=list(args),
        task_queue=JOBS_QUEUE,
        result_type=result_type,
        start_to_close_timeout=STEP,
        retry_policy=STEP_RETRY,
    )
