"""The attempts' way to the cluster: whichever control stream the node has now, if any.

Attempts outlive their control stream (issue 30): a stream ends, the next one (to this
server or another) carries on what the last one did. So the link is the agent's, not a
stream's: each stream `attach`es its connection once welcomed and `detach`es it when it
ends; meanwhile messages wait for the next (`wait_up`). A message that needs an answer is
sent with `exchange`, which waits for the ack with the same key (`deliver`, called by the
stream's receive loop); all of it in Trio.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

import trio

from oz0_common import attempt_messages, file_push
from oz0_node.errors import EdgeUnavailable
from oz0_node.messages import Message

log = logging.getLogger(__name__)

# What an ack answers: its kind, then the job, the attempt and (for output) the seq or
# (for a file's piece) the offset.
AckKey = tuple[object, ...]
OUTPUT_ACK = "job_output_ack"
DONE_ACK = attempt_messages.DONE_ACK


class LinkDown(Exception):
    """No stream took the message in time."""


class Sender(Protocol):
    """What of a control stream the link uses (`transport.EdgeConnection`)."""

    address: str

    async def send(self, kind: str, **fields: object) -> None: ...


def ack_key(kind: str, message: Message) -> AckKey | None:
    """The key of an ack of KIND; None if MESSAGE is not a well-formed one."""
    job, attempt = message.get("job"), message.get("attempt")
    if not isinstance(job, str) or not _whole(attempt):
        return None
    if kind == OUTPUT_ACK:
        seq = message.get("seq")
        return (kind, job, attempt, seq) if _whole(seq) else None
    if kind == file_push.DATA:
        # Several pieces of one push are asked at once: each answer names its offset.
        offset = message.get("offset")
        return (kind, job, attempt, offset) if _whole(offset) else None
    return (kind, job, attempt)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class EdgeLink:
    def __init__(self) -> None:
        self._conn: Sender | None = None
        self._up = trio.Event()
        self._changed = trio.Event()
        self._waiting: dict[AckKey, trio.MemorySendChannel[Message]] = {}
        # trio.current_time() when the last stream ended (None while one is up, or never).
        self.down_since: float | None = None

    @property
    def is_up(self) -> bool:
        return self._conn is not None

    @property
    def address(self) -> str | None:
        return self._conn.address if self._conn is not None else None

    def attach(self, conn: Sender) -> None:
        self._conn = conn
        self.down_since = None
        self._up.set()
        self._wake()

    def detach(self, conn: Sender) -> None:
        if self._conn is not conn:
            return
        self._conn = None
        self._up = trio.Event()
        self.down_since = trio.current_time()
        self._wake()

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_up(self) -> None:
        await self._up.wait()

    async def wait_changed(self) -> None:
        """Until a stream is attached or detached."""
        await self._changed.wait()

    async def send(self, kind: str, fields: Message, within: float) -> None:
        """Send a KIND on the stream there is now; LinkDown if none takes it in WITHIN s."""
        conn = self._conn
        if conn is None:
            raise LinkDown("no control stream")
        with trio.move_on_after(within):
            try:
                await conn.send(kind, **fields)
            except EdgeUnavailable as e:
                raise LinkDown(str(e)) from None
            return
        raise LinkDown(f"edge {conn.address} did not take a {kind} within {within:g} s")

    async def exchange(
        self, kind: str, fields: Message, key: AckKey, within: float
    ) -> Message | None:
        """Send a KIND and wait at most WITHIN s for the ack with KEY: it, or None.

        LinkDown when there is no stream or it did not take the message."""
        send, receive = trio.open_memory_channel[Message](1)
        # Waiting before sending: the ack may be back before the send returns.
        self._waiting[key] = send
        try:
            with trio.move_on_after(within):
                await self.send(kind, fields, within)
                return await receive.receive()
            return None
        finally:
            if self._waiting.get(key) is send:
                del self._waiting[key]

    def deliver(self, kind: str, message: Message) -> None:
        """Hand an ack of KIND to whoever waits for it; others are dropped."""
        key = ack_key(kind, message)
        if key is None:
            # An edge bug, not a reason to end the stream: the sender asks again.
            log.warning("ignoring a malformed %s", kind)
            return
        waiter = self._waiting.pop(key, None)
        if waiter is None:
            log.debug("ignoring an ack nobody waits for (late or repeated): %s", key)
            return
        with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError):
            waiter.send_nowait(message)
