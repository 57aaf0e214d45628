"""The streamed attempts (oz0/jobs/parts.py) of one control stream's node: sent to it, and
what it says it did with each (docs/node-protocol.md, "Attempts over the stream").

Once the node said it takes attempts over the stream (its `max_jobs` with `attempts:
"stream"`), the edge reads the node's streamed attempts still running and sends each
(`attempt`) it has not sent on this stream, again every RESEND_AFTER until the node answers
(`attempt_taken`), and reads again whenever a placement notifies (hub.watch_attempts).
A node that has the attempt already (started, waiting for a slot) answers so and starts
nothing; one that ran it answers `ran`, which ends the part lost if its end was never
recorded (it cannot have started); one that refused it or could not start it answers
why, and that is the part's end. Those ends go the way a reported end goes (part_ends.py).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import trio

from oz0.jobs import parts
from oz0.server.edge.common import Edge, send
from oz0.server.edge.wire import Closed, Wire
from oz0.store.events import JobWatch
from oz0.store.outage import DATABASE_ERRORS
from oz0_common.attempt_messages import (
    ATTEMPT,
    AttemptSent,
    AttemptTaken,
    BadAttemptMessage,
    Failure,
    Taken,
)

log = logging.getLogger(__name__)

# Not answered within this long: sent again (the node runs nothing twice).
RESEND_AFTER = 3.0
# Not answered on this stream within this long of its first send: the node does not take
# it (an agent wedged, though its stream lives): the part ends as an activity no node took
# within its schedule-to-start did (oz0/jobs/workflow/_values.py SCHEDULE_TO_START), and
# moves.
NOT_TAKEN_AFTER = 15.0
NOT_TAKEN = "AttemptNotTaken"
# The database unavailable: read again after this long.
RETRY_AFTER = 1.0
# The failure a node's `ran` stands for.
GONE = "AttemptGone"

Key = tuple[str, int]


class Deliveries:
    """One stream's sending of its node's streamed attempts; `run` in the stream's nursery."""

    def __init__(self, edge: Edge, ws: Wire, node_id: str) -> None:
        self._edge = edge
        self._ws = ws
        self._node_id = node_id
        self._takes = trio.Event()
        # Sent on this stream and not answered yet: when it was last sent.
        self._sent: dict[Key, float] = {}
        # Answered on this stream: not sent again on it.
        self._answered: set[Key] = set()
        # When each was first sent on this stream, until answered.
        self._first_sent: dict[Key, float] = {}
        # The watch of the node's placements, once running: woken to read again.
        self._placed: JobWatch | None = None

    def node_takes_them(self) -> None:
        self._takes.set()

    async def run(self) -> None:
        await self._takes.wait()
        with self._edge.hub.watch_attempts(self._node_id) as placed:
            self._placed = placed
            while True:
                try:
                    # With the other streams' reads that come with it (a fan-out's).
                    read = parts.WaitingRead(self._node_id)
                    waiting: list[parts.Waiting] = await self._edge.waiting_reads.run(read)
                except DATABASE_ERRORS as e:
                    self._edge.outage.failed(e)
                    await trio.sleep(RETRY_AFTER)
                    continue
                if not await self._send(waiting):
                    return
                await self._not_taken()
                due = min(self._sent.values(), default=math.inf) + RESEND_AFTER
                with trio.move_on_at(due):
                    await placed.wait()

    async def _send(self, waiting: list[parts.Waiting]) -> bool:
        """Send those of WAITING not answered and not sent lately; False once the stream
        is closed."""
        now = trio.current_time()
        keys = {(w.job_id, w.number) for w in waiting}
        # Ended meanwhile: nothing more to hear of them here.
        self._answered &= keys
        self._sent = {k: at for k, at in self._sent.items() if k in keys}
        self._first_sent = {k: at for k, at in self._first_sent.items() if k in self._sent}
        for w in waiting:
            key = (w.job_id, w.number)
            if key in self._answered or now - self._sent.get(key, -math.inf) < RESEND_AFTER:
                continue
            self._sent[key] = now
            self._first_sent.setdefault(key, now)
            try:
                await send(self._ws, ATTEMPT, **AttemptSent(w.message, w.lost_after).to_wire())
            except Closed:
                return False
        return True

    async def _not_taken(self) -> None:
        """End the parts the node has not answered for NOT_TAKEN_AFTER (they move)."""
        now = trio.current_time()
        for key, first in list(self._first_sent.items()):
            if now - first < NOT_TAKEN_AFTER:
                continue
            log.warning(
                "node %s did not answer job %s attempt %d within %g s; it moves",
                self._node_id, key[0], key[1], NOT_TAKEN_AFTER,
            )  # fmt: skip
            why = f"the node did not take it within {NOT_TAKEN_AFTER:g} s"
            if await self._end(key, Failure(NOT_TAKEN, why)):
                self._sent.pop(key, None)
                self._first_sent.pop(key, None)
                self._answered.add(key)

    async def _end(self, key: Key, failure: Failure) -> bool:
        """The part KEY ended with FAILURE, written and told; False if not written."""
        report = parts.Report(self._node_id, key[0], key[1], failure=failure)
        try:
            recorded = await self._edge.part_ends.record(report)
        except DATABASE_ERRORS:
            return False
        self._edge.part_ends.tell(recorded)
        return True

    async def answered(self, message: dict[str, Any]) -> None:
        """The node's `attempt_taken`; an end it stands for recorded and told."""
        try:
            taken = AttemptTaken.parse(message)
        except BadAttemptMessage as e:
            log.warning("node %s sent an attempt_taken that is not one (%s); ignored",
                        self._node_id, e)  # fmt: skip
            return
        key = (taken.job, taken.number)
        self._sent.pop(key, None)
        self._first_sent.pop(key, None)
        self._answered.add(key)
        if taken.taken.has_it:
            return
        if taken.taken is Taken.RAN:
            failure = Failure(GONE, "the node ran it before and has it no more")
        else:
            assert taken.failure is not None
            failure = taken.failure
        if not await self._end(key, failure):
            # Sent again (as not answered) RETRY_AFTER from now, the database back or
            # not, with no placement to wake the loop: the node answers again.
            self._answered.discard(key)
            self._sent[key] = trio.current_time() - RESEND_AFTER + RETRY_AFTER
            if self._placed is not None:
                self._placed.wake()
