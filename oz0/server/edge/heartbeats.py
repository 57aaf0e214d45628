"""One task for every control stream's heartbeats and silences (docs/node-protocol.md).

After `welcome` the edge sends each node a heartbeat every interval, an `edges` message
instead when the servers that are up changed, and ends a stream that heard nothing from
its node for three intervals. A task per stream sleeping between heartbeats, and a timer
around each read, would cost every stream a timer and a cancelled sleep per interval: at
10,000 streams, a large share of the one Trio thread's time. Here one task
looks at every stream each TICK, sends the heartbeats that are due straight into their
sockets (wire.py: no await while a socket takes them) and cancels the streams that went
silent; reads have no timer of their own. Only a stream whose socket is full is handed to
a few drain tasks, which close it if its peer has not read within SEND_TIMEOUT.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import trio

from oz0 import nodes
from oz0.server.edge.wire import Closed, text_frame

log = logging.getLogger(__name__)

MISSED_HEARTBEATS = 3
# Heartbeats go out at most this late.
TICK = 0.25
# Streams waiting at once for their socket to take what was sent: a peer that does not read
# holds a drain task until SEND_TIMEOUT.
SENDERS = 64
SEND_TIMEOUT = 10.0
HEARTBEAT_MESSAGE = json.dumps({"type": "heartbeat"})
HEARTBEAT_FRAME = text_frame(HEARTBEAT_MESSAGE)
# What nodes send as a heartbeat, recognised without decoding any JSON.
HEARTBEATS = frozenset({HEARTBEAT_MESSAGE, '{"type":"heartbeat"}'})


class Outbox(Protocol):
    """How the scheduler sends to a stream (a Wire)."""

    def send_now(self, text: str) -> bool: ...

    def send_frame_now(self, frame: bytes) -> bool: ...

    async def drain(self) -> None: ...


@dataclass(eq=False)
class Beat:
    """One stream as the scheduler sees it; `heard` is set by the stream's reader."""

    ws: Outbox
    node_id: str
    scope: trio.CancelScope
    heard: float
    edges: list[str]
    removed: bool = False
    silent: bool = False
    # Handed to a drain task, not back from it yet.
    draining: bool = False


@dataclass
class Heartbeats:
    """The heartbeats of every control stream of one edge.

    Streams wait in slots of TICK seconds for their next heartbeat, so each tick touches
    only the streams due then. Silence is checked when a heartbeat is due: a stream silent
    for three intervals ends within one more.
    """

    edges: Callable[[], list[str]]
    interval: float = nodes.HEARTBEAT
    tick: float = TICK
    senders: int = SENDERS
    send_timeout: float = SEND_TIMEOUT
    _beats: set[Beat] = field(default_factory=set)
    _slots: dict[int, list[Beat]] = field(default_factory=dict)
    _next_slot: int | None = None
    _known_edges: list[str] = field(default_factory=list)
    _due: trio.MemorySendChannel[Beat] | None = None

    def __len__(self) -> int:
        return len(self._beats)

    def _slot(self, when: float) -> int:
        return math.ceil(when / self.tick)

    def _schedule(self, beat: Beat, when: float) -> None:
        self._slots.setdefault(self._slot(when), []).append(beat)

    def add(self, ws: Outbox, node_id: str, scope: trio.CancelScope) -> Beat:
        """Start the heartbeats of a stream just welcomed; SCOPE is cancelled if it goes
        silent. The caller removes it when the stream ends."""
        now = trio.current_time()
        beat = Beat(ws, node_id, scope, now, list(self.edges()))
        self._beats.add(beat)
        self._schedule(beat, now + self.interval)
        return beat

    def remove(self, beat: Beat) -> None:
        beat.removed = True
        self._beats.discard(beat)

    def sweep(self, now: float) -> None:
        """Send the heartbeats due by NOW (or `edges` to every stream if they changed)."""
        edges = self.edges()
        if edges != self._known_edges:
            self._known_edges = list(edges)
            for beat in list(self._beats):
                if beat.edges != edges:
                    self._send(beat, edges)
        last = self._slot(now)
        first = last if self._next_slot is None else self._next_slot
        silent_after = MISSED_HEARTBEATS * self.interval
        for slot in range(first, last + 1):
            for beat in self._slots.pop(slot, ()):
                if beat.removed or beat.silent:
                    continue
                if now - beat.heard >= silent_after:
                    beat.silent = True
                    beat.scope.cancel()
                    continue
                self._send(beat, edges)
                self._schedule(beat, now + self.interval)
        self._next_slot = last + 1

    def _send(self, beat: Beat, edges: list[str]) -> None:
        """A heartbeat, or the edges if BEAT has not had these, without waiting."""
        assert self._due is not None
        try:
            if beat.edges != edges:
                beat.edges = list(edges)
                sent = beat.ws.send_now(json.dumps({"type": "edges", "edges": edges}))
            else:
                sent = beat.ws.send_frame_now(HEARTBEAT_FRAME)
        except (Closed, trio.BrokenResourceError, trio.ClosedResourceError):
            # The stream is ending; its reader sees that and ends it.
            beat.scope.cancel()
            return
        except Exception:
            # One stream's failure must not end every stream's heartbeats.
            log.exception("sending to node %s failed; closing its stream", beat.node_id)
            beat.removed = True
            beat.scope.cancel()
            return
        if not sent and not beat.draining:
            beat.draining = True
            self._due.send_nowait(beat)

    async def _drain(self, due: trio.MemoryReceiveChannel[Beat]) -> None:
        async for beat in due:
            try:
                with trio.move_on_after(self.send_timeout) as waiting:
                    await beat.ws.drain()
                if waiting.cancelled_caught and not beat.removed:
                    log.warning("node %s does not read its stream; closing it", beat.node_id)
                    beat.removed = True
                    beat.scope.cancel()
            except (Closed, trio.BrokenResourceError, trio.ClosedResourceError):
                beat.scope.cancel()
            except Exception:
                log.exception("sending to node %s failed; closing its stream", beat.node_id)
                beat.removed = True
                beat.scope.cancel()
            finally:
                beat.draining = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Unbounded, yet never more than one entry per stream at a time (`draining`).
        send, receive = trio.open_memory_channel[Beat](math.inf)
        self._due = send
        self._known_edges = list(self.edges())
        async with trio.open_nursery() as nursery:
            for _ in range(self.senders):
                nursery.start_soon(self._drain, receive)
            task_status.started()
            while True:
                await trio.sleep(self.tick)
                self.sweep(trio.current_time())
