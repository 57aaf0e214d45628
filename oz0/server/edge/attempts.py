"""The edge's side of attempts that outlive their node's control stream (issue 30).

A node hands each attempt to a supervisor of its own and completes the attempt's Temporal
activity asynchronously; from then on it reports on the attempt over whatever control
stream it has, to whichever server, and that server's edge talks to Temporal for it, by
activity ID (namespace: the node's tenant; workflow: the job; activity: `attempt-N`),
with the server's own Temporal connection (the jobs role's, JobsRole.in_namespace: the
calls themselves, which run on its asyncio loop, are attempt_calls.py's). The
node's own Temporal connection could not: the Temporal host admits a node's heartbeat or
completion only for a task token that host handed it. Instead the edge checks, in the
database, that the attempt is placed on this very node (docs/node-protocol.md):

- `attempt_alive` {"attempts": [{"job", "attempt"}, ...]} (at most MAX_ALIVE): each
  attempt of this node's that runs is heartbeated; one whose job was cancelled is told
  `attempt_stop` "cancelled"; one that is not this node's, has ended, or that Temporal no
  longer has (it timed out: the node was lost, the job moved on) is told `attempt_stop`
  "ended". The database or Temporal unavailable: nothing is said (the node runs on; if
  it lasts, the heartbeat timeout speaks).
- `attempt_done` {"job", "attempt", "result" | "failure" | "cancelled"}: the activity
  completed, failed (non-retryable, of the node's type and message) or reported cancelled,
  answered `attempt_done_ack` {"stored", "reason": null | "ended" | "unavailable"}.
- `max_jobs` {"max_jobs": N, "attempts": "stream"?} (1..MAX_JOBS): how many attempts the
  node runs at once, sent once on each stream, and whether it takes attempts over the
  stream (deliveries.py); recorded on the node's row for placement, tried again while the
  database is away. Nothing is answered.

A streamed attempt (oz0/jobs/parts.py) has no activity: its attempt_alive is answered from
its row alone (read again every beat: `attempt_stop` once it ended, cancelled or moved),
and its attempt_done is written with the others that came with it (part_ends.py) and told
to its workflow; the node's liveness is its stream's heartbeats, written in bulk.

Every Temporal call has a deadline (CALL_TIMEOUT) and runs in a task of the stream's own:
the stream goes on reading meanwhile. A stream has one attempt_alive at Temporal at a time
and DONE_IN_FLIGHT attempt_done; the edge has at most ATTEMPT_CALLS messages there, and
ROW_WORK answered from rows (a streamed part's end is a batched write and its
attempt_alive a read, not Temporal calls: a fan-out's hundreds at once are all taken; an
attempt_alive takes one of ATTEMPT_CALLS only for activities to heartbeat); past those, an
attempt_alive is dropped (the node sends one every second) and an attempt_done answered
"unavailable", each counted (EdgeMetrics).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from temporalio.client import Client
from temporalio.service import RPCError

from oz0 import nodes
from oz0.jobs import parts, store
from oz0.jobs.worker_loop import JobsUnavailable
from oz0.server.edge.attempt_calls import AttemptRef, heartbeats, settling
from oz0.server.edge.common import DatabaseUnavailable, Edge, send
from oz0.server.edge.deliveries import Deliveries
from oz0.server.edge.wire import Closed, Wire
from oz0.store.outage import DATABASE_ERRORS, Outage, until_it_works
from oz0_common.attempt_messages import (
    ALIVE,
    BY_STREAM,
    DONE,
    DONE_ACK,
    STOP,
    AttemptDone,
    BadAttemptMessage,
)
from oz0_common.attempt_messages import MAX_JOBS as MAX_JOBS_MESSAGE

log = logging.getLogger(__name__)


# What `_record_end` says of an attempt that is an activity: its end goes to Temporal.
ACTIVITY = "activity"
MAX_ALIVE = 100
# Temporal writes every heartbeat to the workflow's history shard: one per attempt a second
# (each attempt_alive) was 100 writes a second at 100 running attempts, which starved a
# shard here until workflow tasks on it timed out again and again (bench.outlive, 100
# nodes). An attempt is heartbeated once BEAT_SHARE of its lost-after (its heartbeat
# timeout) has passed since this stream last did, between BEAT_MIN and BEAT_MAX: a new
# stream heartbeats at once, and a cancellation reaches the node within BEAT_MAX or so.
BEAT_SHARE = 0.25
BEAT_MIN, BEAT_MAX = 1.0, 3.0
# The bounds of a node's max_jobs: the nodes table's check, `oz0-node start --max-jobs`
# (oz0_node.identity.MAX_JOBS).
MAX_JOBS = 256
# One message's Temporal calls (all of an attempt_alive's heartbeats together).
CALL_TIMEOUT = 5.0
DONE_IN_FLIGHT = 8
_UNAVAILABLE = (JobsUnavailable, TimeoutError, RPCError)


class NodeAttempts:
    """One control stream's attempt messages; their tasks run in NURSERY (the stream's)."""

    def __init__(
        self,
        edge: Edge,
        ws: Wire,
        node_id: str,
        tenant: str,
        nursery: trio.Nursery,
        deliveries: Deliveries | None = None,
    ) -> None:
        self._edge = edge
        self._deliveries = deliveries
        self._ws = ws
        self._node_id = node_id
        self._tenant = tenant
        self._nursery = nursery
        # Attempts found placed on this node and running (an attempt's node never changes,
        # so that holds for the stream's life; its end is Temporal's NOT_FOUND), each with
        # how often it is heartbeated.
        self._confirmed: dict[AttemptRef, float] = {}
        # When this stream last heartbeated each.
        self._beaten: dict[AttemptRef, float] = {}
        # Those of _confirmed that are streamed: no activity, their row alone says.
        self._streamed: set[AttemptRef] = set()
        self._alive_busy = False
        self._done_busy = 0

    async def received(self, message: dict[str, Any]) -> None:
        """An attempt_alive or attempt_done from the node: its calls started in a task
        of their own (or dropped, counted), never awaited here."""
        kind = message.get("type")
        try:
            if kind == ALIVE:
                self._alive(message)
            elif kind == DONE:
                await self._done(AttemptDone.parse(message))
            elif kind == MAX_JOBS_MESSAGE:
                count, by_stream = _max_jobs(message), message.get("attempts") == BY_STREAM
                self._nursery.start_soon(self._record_max_jobs, count, by_stream)
        except BadAttemptMessage as e:
            log.warning("node %s sent an %s that is not one (%s); ignored", self._node_id, kind, e)

    async def _record_max_jobs(self, count: int, by_stream: bool) -> None:
        """The node's max_jobs, and whether it takes attempts over its stream, on its row,
        once the database takes it (the stream's life at most): placement would otherwise
        go on with the old figures until the next stream."""
        outage = Outage(f"recording node {self._node_id}'s max_jobs", log)

        def record(conn: store.Conn) -> None:
            nodes.set_max_jobs(conn, self._node_id, count)
            parts.set_takes_stream(conn, self._node_id, by_stream)

        await until_it_works(outage, lambda: self._edge.db.transaction(record))
        if by_stream and self._deliveries is not None:
            self._deliveries.node_takes_them()

    def _alive(self, message: dict[str, Any]) -> None:
        entries = message.get("attempts")
        if not isinstance(entries, list) or len(entries) > MAX_ALIVE:
            raise BadAttemptMessage(f"attempts is a list of at most {MAX_ALIVE}")
        refs = list(dict.fromkeys(AttemptRef.parse(e) for e in entries))
        if not refs:
            return
        token = _take(self._edge.row_work, not self._alive_busy)
        if token is None:
            self._edge.metrics.attempt_alive_dropped()
            return
        # One of ATTEMPT_CALLS held from now, as the message comes, for refs that may be
        # activities (not known to be streamed): taken in the order messages come, not in
        # the order their reads end. None: taken when activities turn out due, if there
        # is room then.
        call = self._take_call(any(r not in self._streamed for r in refs))
        self._alive_busy = True
        self._nursery.start_soon(self._heartbeat, refs, token, call)

    async def _done(self, done: AttemptDone) -> None:
        token = _take(self._edge.row_work, self._done_busy < DONE_IN_FLIGHT)
        if token is None:
            self._edge.metrics.attempt_done_refused()
            await self._ack(AttemptRef.of(done), False, "unavailable")
            return
        self._done_busy += 1
        self._nursery.start_soon(self._settle, done, token)

    def _take_call(self, room_here: bool) -> object | None:
        """A token of the edge's ATTEMPT_CALLS if this stream has room too, else None."""
        return _take(self._edge.attempt_calls, room_here)

    async def _heartbeat(self, refs: list[AttemptRef], token: object, call: object | None) -> None:
        stops: list[tuple[AttemptRef, str]] = []
        try:
            running = await self._running(refs, stops, cached=True)
            now = trio.current_time()
            due = [r for r in running if now - self._beaten.get(r, -math.inf) >= self._confirmed[r]]
            streamed = [r for r in due if r in self._streamed]
            if streamed:
                # No activity to heartbeat: the row says whether it still runs.
                for ref in streamed:
                    self._beaten[ref] = now
                ended = len(stops)
                await self._running(streamed, stops, cached=False)
                self._forget([ref for ref, _ in stops[ended:]])
                # Those that ended were forgotten just now: not activities either.
                due = [r for r in due if r not in streamed]
            if due and call is None:
                call = self._take_call(True)
                if call is None:  # counted; the next attempt_alive comes a second later
                    self._edge.metrics.attempt_alive_dropped()
            beats = (
                await self._call(heartbeats(due, CALL_TIMEOUT))
                if due and call is not None
                else None
            )
            if beats is not None:
                for ref, beat in zip(due, beats, strict=True):
                    if beat in ("running", "cancelled"):
                        self._beaten[ref] = now
                stops += [(r, b) for r, b in zip(due, beats, strict=True) if b == "cancelled"]
                # Gone from Temporal: the database says why (a cancellation, or anything
                # else the node need not tell apart).
                gone = [r for r, b in zip(due, beats, strict=True) if b == "ended"]
                self._forget(gone)
                await self._running(gone, stops, cached=False)
        except DatabaseUnavailable:
            self._edge.metrics.attempt_call_unavailable()
        finally:
            self._alive_busy = False
            self._edge.row_work.release_on_behalf_of(token)
            if call is not None:
                self._edge.attempt_calls.release_on_behalf_of(call)
        for ref, why in stops:
            if not await self._say(STOP, job=ref.job, attempt=ref.number, why=why):
                return

    async def _settle(self, done: AttemptDone, token: object) -> None:
        """DONE written (ROW_WORK' TOKEN held), or given to its activity with one of
        ATTEMPT_CALLS; answered once it is (`unavailable` if neither could take it)."""
        ref = AttemptRef.of(done)
        try:
            reason: str | None = "unavailable"
            try:
                # As a streamed part's end first: the write checks it is this node's, runs,
                # and is streamed, so the common case costs no read of its own.
                reason = await self._record_end(done)
                if reason == ACTIVITY:
                    reason = await self._settle_activity(done, ref)
            except DatabaseUnavailable:
                self._edge.metrics.attempt_call_unavailable()
            if reason != "unavailable":
                self._forget([ref])  # its activity is over, either way
        finally:
            self._done_busy -= 1
            self._edge.row_work.release_on_behalf_of(token)
        await self._ack(ref, reason is None, reason)

    async def _settle_activity(self, done: AttemptDone, ref: AttemptRef) -> str | None:
        """DONE given to its activity, within the edge's ATTEMPT_CALLS."""
        call = self._take_call(True)
        if call is None:
            self._edge.metrics.attempt_done_refused()
            return "unavailable"
        try:
            if not await self._running([ref], [], cached=False):
                return "ended"
            answer = await self._call(settling(done, CALL_TIMEOUT))
            return None if answer == "stored" else answer or "unavailable"
        finally:
            self._edge.attempt_calls.release_on_behalf_of(call)

    async def _record_end(self, done: AttemptDone) -> str | None:
        """A streamed attempt's end, written (with others) and then told to its workflow:
        None once stored, "ended" if it had ended otherwise (or is not this node's),
        "unavailable", or ACTIVITY if it is not streamed (its activity takes the end)."""
        report = parts.Report.of(self._node_id, done)
        try:
            recorded = await self._edge.part_ends.record(report)
        except DATABASE_ERRORS:
            return "unavailable"
        if recorded.answer == parts.NOT_STREAMED:
            return ACTIVITY
        self._edge.part_ends.tell(recorded)
        return None if recorded.answer == parts.STORED else "ended"

    async def _running(
        self, refs: list[AttemptRef], stops: list[tuple[AttemptRef, str]], *, cached: bool
    ) -> list[AttemptRef]:
        """Those of REFS placed on this node and not ended (CACHED: those confirmed on this
        stream are not read again); the others go to STOPS, "cancelled" if they ended with
        their job's cancellation, else "ended"."""
        asked = [r for r in refs if not (cached and r in self._confirmed)]
        if not asked:
            return list(refs)

        def read(conn: store.Conn) -> tuple[list[str], dict[str, float], set[tuple[str, int]]]:
            keys = [(r.job, r.number) for r in asked]
            states = store.attempts_of_node(conn, self._node_id, keys)
            running = [
                r.job for r, state in zip(asked, states, strict=True) if state == store.RUNNING
            ]
            if not running:
                return states, {}, set()
            return states, store.lost_after_of(conn, running), parts.streamed_among(conn, keys)

        states, lost_after, streamed = await self._edge.transaction(read)
        for ref, state in zip(asked, states, strict=True):
            if state == store.RUNNING:
                if (ref.job, ref.number) in streamed:
                    self._streamed.add(ref)
                every = lost_after.get(ref.job, BEAT_MIN / BEAT_SHARE) * BEAT_SHARE
                self._confirmed[ref] = min(max(every, BEAT_MIN), BEAT_MAX)
                continue
            if state == store.NOT_ITS:  # not logged louder: a hostile node could flood it
                log.debug(
                    "node %s reported on job %s attempt %d, which is not its own",
                    self._node_id, ref.job, ref.number,
                )  # fmt: skip
            stops.append((ref, "cancelled" if state == store.CANCELLED else "ended"))
        return [r for r in refs if r in self._confirmed]

    def _forget(self, refs: list[AttemptRef]) -> None:
        for ref in refs:
            self._confirmed.pop(ref, None)
            self._beaten.pop(ref, None)
            self._streamed.discard(ref)

    async def _call(self, make: Callable[[Client], Awaitable[Any]]) -> Any:
        """MAKE in the node's tenant's namespace; None (counted) if Temporal cannot be
        reached in time."""
        in_namespace = self._edge.in_namespace
        try:
            if in_namespace is None:
                raise JobsUnavailable("this edge has no Temporal connection")
            return await in_namespace(self._tenant, make, CALL_TIMEOUT)
        except _UNAVAILABLE as e:
            self._edge.metrics.attempt_call_unavailable()
            log.debug("node %s: an attempt call to Temporal failed: %r", self._node_id, e)
            return None

    async def _ack(self, ref: AttemptRef, stored: bool, reason: str | None) -> None:
        await self._say(
            DONE_ACK, job=ref.job, attempt=ref.number, stored=stored, reason=reason
        )  # fmt: skip

    async def _say(self, kind: str, **fields: Any) -> bool:
        """Send to the node; False once its stream is closed (the stream's end is its
        reader's to handle)."""
        try:
            await send(self._ws, kind, **fields)
        except Closed:
            return False
        return True


def _max_jobs(message: dict[str, Any]) -> int:
    count = message.get("max_jobs")
    if not isinstance(count, int) or isinstance(count, bool) or not 0 < count <= MAX_JOBS:
        raise BadAttemptMessage(f"max_jobs is a whole number from 1 to {MAX_JOBS}")
    return count


def _take(limiter: trio.CapacityLimiter, room_here: bool) -> object | None:
    """A token of LIMITER if the stream has room too (ROOM_HERE), else None: never waits."""
    if not room_here:
        return None
    token = object()
    try:
        limiter.acquire_on_behalf_of_nowait(token)
    except trio.WouldBlock:
        return None
    return token
