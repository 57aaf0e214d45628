"""One task for every control stream's heartbeats and silences (docs/node-protocol.md).

After `welcome` the edge sends each node a heartbeat every interval, an `edges` message
instead when the servers that are up changed, and ends a stream that heard nothing from
its node for three intervals. A task per stream sleeping between heartbeats, and a timer
around each read, cost every stream a timer and a cancelled sleep per interval: at 10,000
streams on the one Trio thread that was a large share of the server's time. Here one task
looks at every stream each TICK, hands the heartbeats that are due to a few sender tasks
and cancels the streams that went silent; reads have no timer of their own.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from oz0 import nodes

log = logging.getLogger(__name__)

MISSED_HEARTBEATS = 3
# Heartbeats go out at most this late.
TICK = 0.25
# Sends in flight at once: a peer that does not read holds one sender until SEND_TIMEOUT.
# Trio resumes a task once per pass over the ready tasks, so each sender sends about one
# heartbeat per pass: with 10,000 streams some 500 fall due in a tick.
SENDERS = 1024
SEND_TIMEOUT = 10.0
HEARTBEAT_MESSAGE = json.dumps({"type": "heartbeat"})
# What nodes send as a heartbeat, recognised without decoding any JSON.
HEARTBEATS = frozenset({HEARTBEAT_MESSAGE, '{"type":"heartbeat"}'})


@dataclass(eq=False)
class Beat:
    """One stream as the scheduler sees it; `heard` is set by the stream's reader."""

    ws: WebSocketConnection
    node_id: str
    scope: trio.CancelScope
    heard: float
    edges: list[str]
    removed: bool = False
    silent: bool = False


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

    def add(self, ws: WebSocketConnection, node_id: str, scope: trio.CancelScope) -> Beat:
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
        assert self._due is not None
        edges = self.edges()
        if edges != self._known_edges:
            self._known_edges = list(edges)
            for beat in self._beats:
                if beat.edges != edges:
                    self._due.send_nowait(beat)
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
                self._due.send_nowait(beat)
                self._schedule(beat, now + self.interval)
        self._next_slot = last + 1

    async def _send(self, due: trio.MemoryReceiveChannel[Beat]) -> None:
        async for beat in due:
            if beat.removed:
                continue
            edges = self.edges()
            try:
                with trio.move_on_after(self.send_timeout) as waiting:
                    if beat.edges != edges:
                        beat.edges = list(edges)
                        await beat.ws.send_message(json.dumps({"type": "edges", "edges": edges}))
                    else:
                        await beat.ws.send_message(HEARTBEAT_MESSAGE)
                if waiting.cancelled_caught:
                    log.warning("node %s does not read its stream; closing it", beat.node_id)
                    beat.removed = True
                    beat.scope.cancel()
            except (ConnectionClosed, trio.BrokenResourceError, trio.ClosedResourceError):
                # The stream is ending; its reader sees that and ends it.
                beat.scope.cancel()
            except Exception:
                # One stream's failure must not end every stream's heartbeats.
                log.exception("sending to node %s failed; closing its stream", beat.node_id)
                beat.removed = True
                beat.scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        # Unbounded, yet never more than one entry per stream per interval or change.
        send, receive = trio.open_memory_channel[Beat](math.inf)
        self._due = send
        self._known_edges = list(self.edges())
        async with trio.open_nursery() as nursery:
            for _ in range(self.senders):
                nursery.start_soon(self._send, receive)
            task_status.started()
            while True:
                await trio.sleep(self.tick)
                self.sweep(trio.current_time())
