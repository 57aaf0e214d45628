"""The attempts' way to the edge: `job_output` out over the control stream, its ack back;
and `attempt_refused`, which nothing answers.

Attempts run in the runtime's asyncio thread; the control stream lives in Trio. A send
crosses over with `trio.from_thread.run` from an executor thread and is bounded on the
Trio side, so neither loop ever waits on the other without a deadline. Acks come in on the
stream's receive loop (`commands.dispatch`), which calls `deliver`: that only hands the
ack to the asyncio loop of whoever waits for it, and never blocks Trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from dataclasses import dataclass
from typing import Protocol

import trio

from oz0_node.errors import EdgeUnavailable
from oz0_node.messages import Message

log = logging.getLogger(__name__)

OUTPUT = "job_output"
ACK = "job_output_ack"

# (job ID, attempt, seq): what an ack answers.
AckKey = tuple[str, int, int]


@dataclass(frozen=True)
class Ack:
    stored: bool
    reason: str | None = None


class LinkDown(Exception):
    """The message could not be sent: no stream, or it did not take the message in time."""


class OutputLink(Protocol):
    """How an attempt's output reaches the edge (tests pass fakes)."""

    async def exchange(self, fields: Message, within: float) -> Ack | None:
        """Send a `job_output` with FIELDS and wait at most WITHIN seconds for its ack.

        None when no ack came in time; LinkDown when it could not be sent."""
        ...

    async def notify(self, kind: str, fields: Message, within: float) -> None:
        """Send a message of KIND that nothing answers; LinkDown if not sent within WITHIN."""
        ...


class Sender(Protocol):
    """What of the control stream the link uses (`transport.EdgeConnection`)."""

    address: str

    async def send(self, kind: str, **fields: object) -> None: ...


def ack_key(fields: Message) -> AckKey:
    job, attempt, seq = fields["job"], fields["attempt"], fields["seq"]
    assert isinstance(job, str) and isinstance(attempt, int) and isinstance(seq, int)
    return job, attempt, seq


def parse_ack(message: Message) -> tuple[AckKey, Ack] | None:
    """The key and ack a `job_output_ack` carries; None if it is malformed."""
    job, attempt, seq = message.get("job"), message.get("attempt"), message.get("seq")
    stored, reason = message.get("stored"), message.get("reason")
    if (
        not isinstance(job, str)
        or not _is_int(attempt)
        or not _is_int(seq)
        or not isinstance(stored, bool)
        or not (reason is None or isinstance(reason, str))
    ):
        return None
    assert isinstance(attempt, int) and isinstance(seq, int)
    return (job, attempt, seq), Ack(stored=stored, reason=reason)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


async def send_bounded(conn: Sender, fields: Message, within: float, kind: str = OUTPUT) -> None:
    """In Trio: send a KIND on CONN, or LinkDown if it takes more than WITHIN s."""
    with trio.move_on_after(within):
        try:
            await conn.send(kind, **fields)
        except EdgeUnavailable as e:
            raise LinkDown(str(e)) from None
        return
    raise LinkDown(f"edge {conn.address} did not take a {kind} within {within:g} s")


class StreamLink:
    """The output link over one control stream: made by its Trio side, used from asyncio."""

    def __init__(self, conn: Sender, token: trio.lowlevel.TrioToken) -> None:
        self.conn = conn
        self._token = token
        self._lock = threading.Lock()
        self._waiting: dict[AckKey, tuple[asyncio.AbstractEventLoop, asyncio.Future[Ack]]] = {}

    # --- the Trio side ------------------------------------------------------------------

    def deliver(self, message: Message) -> None:
        """Hand a `job_output_ack` to the attempt waiting for it; others are dropped."""
        parsed = parse_ack(message)
        if parsed is None:
            # An edge bug, not a reason to end the stream and with it every attempt here:
            # the attempt sends the same seq again or gives up, as for a lost ack.
            log.warning("ignoring a malformed job_output_ack from edge %s", self.conn.address)
            return
        key, ack = parsed
        with self._lock:
            waiter = self._waiting.pop(key, None)
        if waiter is None:
            log.debug("ignoring an ack nobody waits for (late or repeated): %s", key)
            return
        loop, future = waiter
        with contextlib.suppress(RuntimeError):  # the runtime's loop has closed
            loop.call_soon_threadsafe(_resolve, future, ack)

    # --- the asyncio side ---------------------------------------------------------------

    async def exchange(self, fields: Message, within: float) -> Ack | None:
        key = ack_key(fields)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Ack] = loop.create_future()
        # Waiting before sending: the ack may come back before the send has returned here.
        with self._lock:
            self._waiting[key] = (loop, future)
        try:
            deadline = loop.time() + within
            await loop.run_in_executor(None, self._send, fields, within)
            try:
                return await asyncio.wait_for(future, max(deadline - loop.time(), 0))
            except TimeoutError:
                return None
        finally:
            with self._lock:
                if self._waiting.get(key, (None, None))[1] is future:
                    del self._waiting[key]

    async def notify(self, kind: str, fields: Message, within: float) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, self._send, fields, within, kind)

    def _send(self, fields: Message, within: float, kind: str = OUTPUT) -> None:
        """In an executor thread: run the send in Trio and wait for it."""
        try:
            trio.from_thread.run(
                send_bounded, self.conn, fields, within, kind, trio_token=self._token
            )
        except (trio.RunFinishedError, trio.Cancelled):
            raise LinkDown(f"the control stream to edge {self.conn.address} has ended") from None


def _resolve(future: asyncio.Future[Ack], ack: Ack) -> None:
    if not future.done():
        future.set_result(ack)
