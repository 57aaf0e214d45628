"""An attempt's output, relayed to the edge while the command runs (docs/node-protocol.md).

stdout and stderr are read as they come and kept in the order they arrived; consecutive
output of one stream is sent together, at most MESSAGE_DATA bytes a message, once that
much is waiting or FLUSH_EVERY after the oldest byte waiting arrived. Stop-and-wait: the
next message goes only after the ack of the last, so seq numbers never cross and a slow
edge batches more into each message. At OUTPUT_CAP bytes (both streams together) one
message with no data and `truncated` true marks the cut; the rest is read and dropped,
so the command never blocks on a full pipe.

The ack decides: stored, the next message; "ended" (the cluster no longer runs this
attempt here), AttemptEnded; "unavailable", no ack within ACK_TIMEOUT or a stream that
cannot send, the same seq again RETRY_AFTER later, until GIVE_UP_AFTER from its first
send: then the relay gives up, drops everything else, and the command runs on.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import logging

from oz0_node.jobs.link import Ack, LinkDown, OutputLink
from oz0_node.messages import Message

log = logging.getLogger(__name__)

OUTPUT_CAP = 1 << 20
MESSAGE_DATA = 32 << 10
FLUSH_EVERY = 0.25
ACK_TIMEOUT = 10.0
RETRY_AFTER = 1.0
GIVE_UP_AFTER = 10.0
# Once the command has ended: how long what is still waiting has to be sent and acked.
FINAL_FLUSH = 10.0


class AttemptEnded(Exception):
    """The edge said the cluster no longer runs this attempt on this node."""


class OutputRelay:
    """One attempt's output on its way to the edge; `start` it, `add`, then `finish`."""

    def __init__(
        self, job_id: str, attempt: int, link: OutputLink, *, cap: int = OUTPUT_CAP
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.cap = cap
        self.output_bytes = 0  # kept (at most the cap), whether acked or not
        self.truncated = False
        self.gave_up = False
        # Set once an ack says "ended": the attempt must end.
        self.ended = asyncio.Event()
        self._link = link
        self._pieces: collections.deque[tuple[str, bytearray]] = collections.deque()
        self._waiting_bytes = 0
        self._oldest_at: float | None = None
        self._marker: str | None = None  # the stream whose output hit the cap, until sent
        self._closed = False
        self._wake = asyncio.Event()
        self._seq = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._send_all(), name=f"output {self.label}")

    @property
    def label(self) -> str:
        return f"{self.job_id} attempt {self.attempt}"

    def add(self, stream: str, data: bytes) -> None:
        """Keep DATA (read from STREAM) for sending, up to the cap."""
        if self.gave_up or self.truncated or not data:
            return
        room = self.cap - self.output_bytes
        kept = data[:room]
        if kept:
            if self._pieces and self._pieces[-1][0] == stream:
                self._pieces[-1][1].extend(kept)
            else:
                self._pieces.append((stream, bytearray(kept)))
            self.output_bytes += len(kept)
            self._waiting_bytes += len(kept)
            if self._oldest_at is None:
                self._oldest_at = asyncio.get_running_loop().time()
        if len(data) > room:
            self.truncated = True
            self._marker = stream
        self._wake.set()

    async def finish(self, within: float = FINAL_FLUSH) -> bool:
        """Send and get acked what waits, within WITHIN s; whether all of it was stored.

        Raises AttemptEnded if an ack says the attempt has ended."""
        self._closed = True
        self._wake.set()
        task = self._task
        assert task is not None, "finish() before start()"
        done, _ = await asyncio.wait([task], timeout=within)
        if not done:
            log.warning(
                "output of job %s: not all of it was stored within %g s of the command's end",
                self.label,
                within,
            )
            await self.abandon()
            return False
        task.result()  # AttemptEnded
        return not self.gave_up

    async def abandon(self) -> None:
        """Stop sending (the attempt ends without its output); safe to repeat."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, AttemptEnded):
                await task
        elif task is not None and not task.cancelled():
            task.exception()  # an AttemptEnded the attempt has acted on already
        self.gave_up = self.gave_up or bool(self._pieces or self._marker)

    # --- the sender -----------------------------------------------------------------------

    def _has_waiting(self) -> bool:
        return bool(self._pieces) or self._marker is not None

    async def _send_all(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._has_waiting():
                if self._closed or self.gave_up:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            # Wait for a full message, the command's end, or the oldest byte's flush time.
            while (
                self._waiting_bytes < MESSAGE_DATA
                and not self._closed
                and self._oldest_at is not None
                and (left := self._oldest_at + FLUSH_EVERY - loop.time()) > 0
            ):
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), left)
            fields = self._next_message()
            if not await self._deliver(fields):
                self._give_up()
                return
            self._seq += 1

    def _next_message(self) -> Message:
        if self._pieces:
            stream, waiting = self._pieces[0]
            data = bytes(waiting[:MESSAGE_DATA])
            del waiting[:MESSAGE_DATA]
            if not waiting:
                self._pieces.popleft()
            self._waiting_bytes -= len(data)
            truncated = False
        else:
            assert self._marker is not None
            stream, data, truncated = self._marker, b"", True
            self._marker = None
        if not self._pieces:
            self._oldest_at = None
        return {
            "job": self.job_id,
            "attempt": self.attempt,
            "seq": self._seq,
            "stream": stream,
            "data": base64.b64encode(data).decode("ascii"),
            "truncated": truncated,
        }

    async def _deliver(self, fields: Message) -> bool:
        """Send FIELDS until acked as stored; False once it is time to give up."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + GIVE_UP_AFTER
        while (left := give_up_at - loop.time()) > 0:
            try:
                ack = await self._link.exchange(fields, min(ACK_TIMEOUT, left))
            except LinkDown as e:
                log.info("output of job %s, seq %s: %s", self.label, fields["seq"], e)
                ack = Ack(stored=False, reason="unavailable")
            if ack is not None and ack.stored:
                return True
            if ack is not None and ack.reason == "ended":
                self.ended.set()
                raise AttemptEnded(f"the cluster no longer runs job {self.label} on this node")
            if ack is not None and ack.reason != "unavailable":
                log.warning(
                    "output of job %s: unknown ack reason %r; taken as unavailable",
                    self.label,
                    ack.reason,
                )
            await asyncio.sleep(min(RETRY_AFTER, max(give_up_at - loop.time(), 0)))
        return False

    def _give_up(self) -> None:
        log.warning(
            "output of job %s: the cluster stored nothing for %g s; dropping the rest of it",
            self.label,
            GIVE_UP_AFTER,
        )
        self.gave_up = True
        self._pieces.clear()
        self._waiting_bytes = 0
        self._marker = None
        self._oldest_at = None
