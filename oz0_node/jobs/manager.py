"""The node's attempts, kept across control streams and across the agent's own restarts.

Each attempt runs under a supervisor process of its own (supervisor.py, started and
followed through supervisor_client.py), which owns the command, its output file and its
exit status, so neither a server's restart nor the agent's touches the command. This
manager, one per agent and in Trio:

- starts an attempt's supervisor when the runtime's activity hands the attempt over
  (`start`, from the runtime's asyncio thread through manager_port.py), at most `max_running`
  at once (`oz0-node start --max-jobs`); the activity then completes asynchronously: from
  here on the node speaks for the attempt over whatever control stream it has, and the
  edge speaks to Temporal for it;
- tells the cluster every ALIVE_EVERY which attempts run here (`attempt_alive`): the edge
  records a heartbeat for each, so a node is lost for a job only once no server has heard
  from it for the job's lost-after;
- relays each attempt's output from its file to the edge (`job_output`: one stream a
  message, at most MESSAGE_DATA bytes, stop-and-wait on its ack), resumed exactly where the
  last ack left it after a reconnect or a restart: DIR/relay.json records the next seq, the
  offset stored up to and the message in flight (sent again as it was);
- reports the attempt's end once its output is stored (`attempt_done`, until acked), then
  removes its directory;
- ends an attempt when the cluster says it is no longer this node's (`attempt_stop`, an
  output ack "ended"), all of them when the node is blocked, deleted or purged, and one
  whose node has reached no server for its lost-after and REPORT_GRACE more (the cluster
  has given it up by then: "a command is ended with its attempt").

A new agent finds the attempts of the last one (`supervisor_client.find_all`) and carries
on.

A *held* attempt (scheduled by a workflow from before the upgrade, attempt.py `run_held`)
is the same but for its end and its heartbeats, which are its activity's own: the manager
sends no `attempt_alive` for it (no edge could heartbeat an activity that is not
`attempt-N`) and gives its end to the activity (`answer`) rather than as an
`attempt_done`. DIR/attempt.json says it is held, so that a new agent ends it: the
activity went with the last agent and nobody can complete it any more.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from oz0_common.attempt_messages import (
    ALIVE,
    DEFAULT_LOST_AFTER,
    DONE,
    AttemptDone,
    EndedBecause,
    Failure,
)
from oz0_common.files import write_private
from oz0_node.identity import DEFAULT_MAX_JOBS
from oz0_node.jobs import supervisor_client
from oz0_node.jobs.attempt import ATTEMPT_ENDED, NODE_STOPPING, Answer
from oz0_node.jobs.attempt_files import HEADER, AttemptStatus, OutputRecord, SupervisedSpec
from oz0_node.jobs.edge_link import DONE_ACK, OUTPUT_ACK, EdgeLink, LinkDown
from oz0_node.jobs.file_push import PushPolicy
from oz0_node.jobs.grants import RunRecord
from oz0_node.jobs.isolation import Isolation
from oz0_node.jobs.launcher import Launcher
from oz0_node.jobs.process import KILL_GRACE
from oz0_node.jobs.supervisor_client import Supervised
from oz0_node.messages import Message

log = logging.getLogger(__name__)

ALIVE_EVERY = 1.0
# How often a followed attempt's output file and status are looked at.
FOLLOW_EVERY = 0.1
MESSAGE_DATA = 32 << 10
ALIVE_BATCH = 100
ACK_TIMEOUT = 10.0
RETRY_AFTER = 1.0
SEND_WITHIN = 5.0
# Past its lost-after with no stream to any server, and this much more, the cluster has
# given the attempt up (moved it, or failed the job): it is ended, its report dropped.
REPORT_GRACE = 30.0
STOP_WITHIN = KILL_GRACE + 5.0
STATE_FILE = "relay.json"
META_FILE = "attempt.json"
# Why the node ended an attempt, when its end is not worth a report: the cluster has
# moved on from it already (or is about to forget the node).
UNREPORTED = ("ended", "blocked", "removed", "purged", "lost")
# Why, and the failure's type, when the node itself could not follow an attempt further.
FAULT = "fault"
NODE_FAULT = "NodeFault"
# Why a new agent ends a held attempt it finds.
ORPHANED = "its activity went with the previous agent"

Key = tuple[str, int]


@dataclass
class RelayState:
    """How far an attempt's output got: the next seq, the offset stored up to, and the
    message in flight, (seq, start, end) of the output file, sent again as it was."""

    seq: int = 0
    offset: int = 0
    inflight: tuple[int, int, int] | None = None

    @classmethod
    def load(cls, directory: Path) -> RelayState:
        try:
            raw = json.loads((directory / STATE_FILE).read_text())
            inflight = raw.get("inflight")
            return cls(
                seq=int(raw["seq"]),
                offset=int(raw["offset"]),
                inflight=tuple(int(v) for v in inflight) if inflight else None,  # type: ignore[arg-type]
            )
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, KeyError, TypeError) as e:
            # Sent again from the start: the edge stores each seq once, so only what the
            # cluster has not yet got is added (a seq's data may differ: logged).
            log.warning("cannot read %s (%s): its output is sent again", directory / STATE_FILE, e)
            return cls()

    def save(self, directory: Path) -> None:
        write_private(
            directory / STATE_FILE,
            json.dumps(
                {"seq": self.seq, "offset": self.offset, "inflight": self.inflight}
            ).encode(),
        )


@dataclass(eq=False)
class Tracked:
    supervised: Supervised
    lost_after: float
    state: RelayState
    # Why the node ended it, if it did (cancelled, ended, blocked, purged, lost, ...).
    stop_why: str | None = None
    output_dropped: bool = False
    done: trio.Event = field(default_factory=trio.Event)
    # Held: its activity, not the edge, takes its end (ANSWER; None once that activity
    # is gone with a previous agent).
    held: bool = False
    answer: Answer | None = None

    @property
    def key(self) -> Key:
        return self.supervised.job_id, self.supervised.attempt

    @property
    def label(self) -> str:
        return f"{self.supervised.job_id} attempt {self.supervised.attempt}"


def _meta(directory: Path) -> tuple[float, bool]:
    """DIR/attempt.json: the attempt's lost-after, and whether it is held."""
    try:
        raw = json.loads((directory / META_FILE).read_text())
        value = float(raw["lost_after"])
        return (value if value > 0 else DEFAULT_LOST_AFTER), raw.get("held") is True
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return DEFAULT_LOST_AFTER, False


class AttemptManager:
    def __init__(
        self,
        data_dir: Path,
        isolation: Isolation,
        link: EdgeLink | None = None,
        *,
        max_running: int = DEFAULT_MAX_JOBS,
    ) -> None:
        self.data_dir = data_dir
        self.isolation = isolation
        self.max_running = max_running
        self.link = link if link is not None else EdgeLink()
        # Where file pushes may write (file_push.py, run by the intake); by default only
        # DATA_DIR/files.
        self.pushes: PushPolicy | None = PushPolicy.of(data_dir)
        self._live: dict[Key, Tracked] = {}
        self._reserved = 0
        self._freed = trio.Event()
        self._run_record: RunRecord | None = None
        # How many times stop_all has run, and why last: an attempt whose supervisor was
        # being launched meanwhile is ended as soon as it is (`start`).
        self._stops = 0
        self._stopped_why = ""
        self._nursery: trio.Nursery | None = None
        self._started_at = 0.0
        # Forks the attempts' supervisors (launcher.py): a fresh interpreter for each cost
        # some 80 ms of CPU and of every dispatch.
        self.launcher = Launcher()

    def __len__(self) -> int:
        return len(self._live)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Follow the attempts a previous agent left, then those started, until cancelled
        (the supervisors run on: the agent's exit never touches a command)."""
        self._started_at = trio.current_time()
        try:
            # In Trio's thread, as find_all below: a vfork and exec, a few milliseconds (the
            # launcher's interpreter starts on its own); a worker thread would let a test's
            # autojump clock race ahead.
            self.launcher.start()
            await self._run(task_status)
        finally:
            # It exits as soon as its socket closes (a millisecond, at most STOP_WITHIN: in
            # Trio's thread too, for the same reason); the supervisors it forked run on.
            self.launcher.stop()

    async def _run(self, task_status: trio.TaskStatus[None]) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            # Read in Trio's thread: a directory listing, once, before anything else runs
            # (and a worker thread would let a test's autojump clock race ahead of it).
            for found in supervisor_client.find_all(self.data_dir):
                state = "running" if found.alive() else "ended"
                log.info("re-attached job %s attempt %d (%s)", found.job_id, found.attempt, state)
                lost_after, held = _meta(found.dir)
                tracked = self._track(found, lost_after, held=held)
                if held:
                    # Its output is still relayed; its end goes to nobody.
                    self._stop(tracked, ORPHANED)
            nursery.start_soon(self._tell_alive)
            task_status.started()
            await trio.sleep_forever()

    # --- starting -------------------------------------------------------------------------

    def try_reserve(self) -> bool:
        """A slot for one more attempt, if one is free (`reserve` waits for one)."""
        if len(self._live) + self._reserved >= self.max_running:
            return False
        self._reserved += 1
        return True

    async def reserve(self) -> None:
        """Until a slot is free, then take it (an attempt sent over the stream waits here;
        `start` gives it back)."""
        while not self.try_reserve():
            await self._freed.wait()

    def release(self) -> None:
        self._reserved -= 1
        self._slot_freed()

    def _slot_freed(self) -> None:
        self._freed.set()
        self._freed = trio.Event()

    def has(self, job_id: str, attempt: int) -> bool:
        """Whether that attempt is followed here (running, or its end being reported)."""
        return (job_id, attempt) in self._live

    def start_soon(self, work: Callable[[], Awaitable[None]]) -> None:
        """WORK in the manager's nursery: it outlives the stream that brought it."""
        assert self._nursery is not None, "start_soon() before run()"
        self._nursery.start_soon(work)

    def run_record(self, data_dir: Path) -> RunRecord:
        """The agent's one record of the attempts it ran (grants.py): every way an attempt
        comes in checks against it, so that a write of one keeps the other's entries."""
        if self._run_record is None:
            self._run_record = RunRecord.load(data_dir)
        return self._run_record

    async def start(
        self, spec: SupervisedSpec, lost_after: float, answer: Answer | None = None
    ) -> None:
        """Start SPEC's supervisor in a reserved slot and follow it; OSError if its
        directory cannot be made (the supervisor reports a command that cannot start).
        With ANSWER it is held: its end goes to ANSWER, and the edge hears only its output."""
        held = answer is not None
        stops = self._stops
        try:
            supervised = await trio.to_thread.run_sync(
                supervisor_client.launch, self.data_dir, spec, self.isolation, self.launcher
            )
            meta = {"lost_after": lost_after, **({"held": True} if held else {})}
            write_private(supervised.dir / META_FILE, json.dumps(meta).encode())
            tracked = self._track(supervised, lost_after, held=held, answer=answer)
            if self._stops != stops:
                # The node was blocked, deleted or purged while this one was launched.
                self._stop(tracked, self._stopped_why)
        finally:
            self.release()

    def _track(
        self,
        supervised: Supervised,
        lost_after: float,
        *,
        held: bool = False,
        answer: Answer | None = None,
    ) -> Tracked:
        assert self._nursery is not None, "start() before run()"
        tracked = Tracked(
            supervised, lost_after, RelayState.load(supervised.dir), held=held, answer=answer
        )
        self._live[tracked.key] = tracked
        self._nursery.start_soon(self._follow, tracked)
        return tracked

    def runs(self, job_id: str, attempt: int) -> bool:
        """Whether that attempt is this manager's and its end will be reported to the edge
        (not held, not ended for a reason the cluster is not told)."""
        tracked = self._live.get((job_id, attempt))
        return (
            tracked is not None
            and not tracked.held
            and (tracked.stop_why is None or tracked.stop_why not in UNREPORTED)
        )

    # --- ending ---------------------------------------------------------------------------

    def stop(self, job_id: str, attempt: int, why: str) -> None:
        """End that attempt here (the cluster said so: WHY); unknown ones are ignored."""
        tracked = self._live.get((job_id, attempt))
        if tracked is None:
            log.debug("asked to stop job %s attempt %d, which does not run here", job_id, attempt)
            return
        self._stop(tracked, why)

    def _stop(self, tracked: Tracked, why: str) -> None:
        if tracked.stop_why is not None:
            return
        tracked.stop_why = why
        log.info("job %s: ending it here (%s)", tracked.label, why)
        assert self._nursery is not None
        self._nursery.start_soon(trio.to_thread.run_sync, tracked.supervised.stop)

    async def stop_all(self, why: str, within: float = STOP_WITHIN) -> None:
        """End every attempt (blocked, deleted, purged): WHY; wait at most WITHIN for them."""
        self._stops += 1
        self._stopped_why = why
        live = list(self._live.values())
        if live:
            log.info("ending %d job attempt(s): %s", len(live), why)
        for tracked in live:
            self._stop(tracked, why)
        with trio.move_on_after(within):
            for tracked in live:
                await tracked.done.wait()

    # --- following one attempt ------------------------------------------------------------

    async def _follow(self, tracked: Tracked) -> None:
        try:
            try:
                outcome = await self._relay_until_ended(tracked)
            except Exception as e:  # one attempt's fault must not end the agent
                # A damaged output or relay file, a full disk, a bug: this attempt cannot
                # be followed further. It is ended and reported failed; the agent and its
                # other attempts carry on.
                log.exception("job %s: cannot follow it further; ending it", tracked.label)
                outcome = await self._fault(tracked, e)
            if tracked.held:
                if outcome is not None and tracked.answer is not None:
                    tracked.answer(outcome)
            elif outcome is not None:
                await self._report(tracked, outcome)
            try:
                await trio.to_thread.run_sync(tracked.supervised.remove)
            except OSError as e:
                log.warning("job %s: its directory is not removed: %s", tracked.label, e)
        finally:
            self._live.pop(tracked.key, None)
            self._slot_freed()
            tracked.done.set()

    async def _fault(self, tracked: Tracked, error: Exception) -> Message | None:
        """End TRACKED after the node failed to follow it (ERROR): what to report."""
        fresh = tracked.stop_why is None
        if fresh:
            tracked.stop_why = FAULT
        await trio.to_thread.run_sync(tracked.supervised.end_now, STOP_WITHIN)
        if not fresh and tracked.stop_why in UNREPORTED:
            return None
        job, number = tracked.key
        return {
            "job": job,
            "attempt": number,
            "failure": {
                "type": NODE_FAULT,
                "message": f"job {tracked.label}: the node could not follow it further "
                f"({type(error).__name__}: {str(error)[:200]}); it was ended",
            },
        }

    async def _relay_until_ended(self, tracked: Tracked) -> Message | None:
        """Relay the output until the attempt has ended and all of it is stored; what to
        report then (None: nothing, the cluster has moved on from it)."""
        sup = tracked.supervised
        while True:
            # The status first: once it is there, the file holds all of the output.
            status = await trio.to_thread.run_sync(sup.status)
            alive = status is None and await trio.to_thread.run_sync(sup.alive)
            if status is None and not alive:
                # It may have written its status just before it let go of its lock.
                status = await trio.to_thread.run_sync(sup.status)
            ended = status is not None or not alive
            caught_up = await self._send_output(tracked)
            if ended and (caught_up or self._given_up(tracked)):
                if status is None:
                    log.warning("job %s: its supervisor died; ending what it left", tracked.label)
                    await trio.to_thread.run_sync(sup.end_leftovers)
                if tracked.stop_why in UNREPORTED and not tracked.held:
                    return None
                tracked.output_dropped = tracked.output_dropped or not caught_up
                return self._outcome(tracked, status)
            if not ended and self._given_up(tracked):
                self._stop(tracked, "lost")
            with trio.move_on_after(FOLLOW_EVERY if caught_up else RETRY_AFTER):
                await self.link.wait_changed()

    def _given_up(self, tracked: Tracked) -> bool:
        """Whether the node has reached no server for longer than the cluster waits."""
        if self.link.is_up:
            return False
        since = self.link.down_since if self.link.down_since is not None else self._started_at
        return trio.current_time() - since > tracked.lost_after + REPORT_GRACE

    def _outcome(self, tracked: Tracked, status: AttemptStatus | None) -> Message:
        job, number = tracked.key
        if status is None:
            done = AttemptDone(job, number, failure=Failure(
                "SupervisorLost",
                f"job {tracked.label}: its supervisor on this node ended without a status "
                "(killed?); what it left running was ended",
            ))  # fmt: skip
        elif status.result.ended_because is EndedBecause.STOPPED:
            if tracked.stop_why == "cancelled":
                done = AttemptDone(job, number, cancelled=True)
            else:
                done = AttemptDone(job, number, failure=Failure(
                    # Only a held attempt's activity hears of an end the cluster asked for.
                    ATTEMPT_ENDED if tracked.stop_why == "ended" else NODE_STOPPING,
                    f"job {tracked.label}: ended on the node "
                    f"({tracked.stop_why or 'its supervisor was stopped'})",
                ))  # fmt: skip
        else:
            done = AttemptDone(job, number, result=status.result.with_output_complete(
                not tracked.output_dropped
            ))  # fmt: skip
        return done.to_wire()

    async def _report(self, tracked: Tracked, fields: Message) -> None:
        """Send the attempt's end until the cluster has it (or has moved on from it)."""
        key = (DONE_ACK, *tracked.key)
        while not self._given_up(tracked):
            if not self.link.is_up:
                with trio.move_on_after(RETRY_AFTER):
                    await self.link.wait_up()
                continue
            try:
                ack = await self.link.exchange(DONE, fields, key, ACK_TIMEOUT)
            except LinkDown as e:
                log.info("job %s: its end not reported yet: %s", tracked.label, e)
                ack = None
            if ack is not None and (ack.get("stored") is True or ack.get("reason") == "ended"):
                log.info(
                    "job %s: its end %s",
                    tracked.label,
                    "reported" if ack.get("stored") else "is no longer the cluster's concern",
                )
                return
            await trio.sleep(RETRY_AFTER)
        log.warning("job %s: no server for too long; its end is not reported", tracked.label)

    # --- its output -----------------------------------------------------------------------

    async def _send_output(self, tracked: Tracked) -> bool:
        """Send what output is waiting; True once all of it is stored (caught up), False
        when the stream is down or did not store it (tried again later)."""
        sup, state = tracked.supervised, tracked.state
        while not tracked.output_dropped:
            if state.inflight is None:
                records, _ = await trio.to_thread.run_sync(
                    sup.read_output, state.offset, MESSAGE_DATA
                )
                message = _one_message(records, state.offset)
                if message is None:
                    return True
                _, end = message
                state.inflight = (state.seq, state.offset, end)
                await trio.to_thread.run_sync(state.save, sup.dir)
            seq, start, end = state.inflight
            records, _ = await trio.to_thread.run_sync(sup.read_output, start, MESSAGE_DATA)
            fields = _fields(tracked, seq, _upto(records, start, end))
            if not self.link.is_up:
                return False
            try:
                ack = await self.link.exchange(
                    "job_output", fields, (OUTPUT_ACK, *tracked.key, seq), ACK_TIMEOUT
                )
            except LinkDown as e:
                log.info("output of job %s, seq %d: %s", tracked.label, seq, e)
                return False
            if ack is None or ack.get("stored") is not True:
                if ack is not None and ack.get("reason") == "ended":
                    self._stop(tracked, "ended")
                    tracked.output_dropped = True
                    return True
                return False
            state.seq, state.offset, state.inflight = seq + 1, end, None
            await trio.to_thread.run_sync(state.save, sup.dir)
        return True

    # --- telling the cluster they run -----------------------------------------------------

    async def _tell_alive(self) -> None:
        while True:
            # Not the held ones: no edge can heartbeat their activities (attempt.py).
            entries = [
                {"job": job, "attempt": number}
                for (job, number), tracked in self._live.items()
                if tracked.stop_why not in UNREPORTED and not tracked.held
            ]
            if entries and self.link.is_up:
                for at in range(0, len(entries), ALIVE_BATCH):
                    try:
                        await self.link.send(
                            ALIVE,
                            {"attempts": entries[at : at + ALIVE_BATCH]},
                            SEND_WITHIN,
                        )
                    except LinkDown as e:
                        log.debug("attempt_alive not sent: %s", e)
                        break
            # A new stream is told at once; otherwise every ALIVE_EVERY.
            with trio.move_on_after(ALIVE_EVERY):
                await self.link.wait_changed()


def _one_message(records: list[OutputRecord], start: int) -> tuple[int, int] | None:
    """How many of RECORDS (read from START) make the next message, and the offset after
    them: records of one stream, at most MESSAGE_DATA bytes; the cap's mark alone."""
    if not records:
        return None
    first = records[0]
    if first.truncated:
        return 1, start + _size(first)
    size, count, end = 0, 0, start
    for record in records:
        if record.truncated or record.stream != first.stream:
            break
        if count and size + len(record.data) > MESSAGE_DATA:
            break
        size += len(record.data)
        count += 1
        end += _size(record)
    return count, end


def _size(record: OutputRecord) -> int:
    """How much of the output file RECORD takes (attempt_files.py frames each one)."""
    return HEADER.size + len(record.data)


def _upto(records: list[OutputRecord], start: int, end: int) -> list[OutputRecord]:
    """The RECORDS (read from START) that end by END: the message in flight, again."""
    kept, at = [], start
    for record in records:
        at += _size(record)
        if at > end:
            break
        kept.append(record)
    return kept


def _fields(tracked: Tracked, seq: int, records: list[OutputRecord]) -> Message:
    job, number = tracked.key
    first = records[0]
    return {
        "job": job,
        "attempt": number,
        "seq": seq,
        "stream": first.stream,
        "data": base64.b64encode(b"".join(r.data for r in records)).decode("ascii"),
        "truncated": first.truncated,
    }
