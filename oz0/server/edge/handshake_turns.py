"""Turns at the Trio thread for TLS handshakes, oldest connection first, so a crowd of them
cannot stall the edge nor each other.

Each step of a TLS handshake (the peer's bytes in, a millisecond or so of cryptography,
the answer out) runs on the server's one Trio thread, and Trio runs every task that is
ready before it looks at its timers again: when a thousand nodes reconnect at once, every
stream's heartbeat, every block and the server's own membership heartbeat would wait
behind a thousand such steps. A connection takes a turn once its peer's bytes are in and
gives it back at its next read or write, so at most TURNS steps run between two looks at
the timers. Waiting for the network holds no turn: a peer that sends nothing, or stalls
halfway, keeps nobody else waiting.

Turns go to the connection accepted first. Shared in order of arrival instead, a crowd
larger than the thread can serve in time progresses all at once, each too slowly to
finish before its node gives up, and the server spends itself on handshakes nobody waits
for any more (measured: 466 of 3,333 nodes of a killed server back on the survivors after
180 s). Oldest first, the handshakes begun are finished, and one whose first turn has not
come within FIRST_TURN_WAIT seconds is closed before the server did any work for it: its
node backs off and tries another edge, well inside its own 10 s for a handshake.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections.abc import Callable

import trio

log = logging.getLogger(__name__)

TURNS = 16
FIRST_TURN_WAIT = 2.0
LOG_EVERY = 60.0


class Busy(trio.BrokenResourceError):
    """No first turn came in time: the connection is closed before its handshake."""


class _Waiter:
    __slots__ = ("event", "given", "gone")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.given = False
        self.gone = False


class Turns:
    """The turns of one listener's connections, given to the earliest accepted first."""

    def __init__(
        self,
        listener: str,
        count: int = TURNS,
        *,
        first_wait: float = FIRST_TURN_WAIT,
        log_every: float = LOG_EVERY,
        on_busy: Callable[[], None] | None = None,
    ) -> None:
        self.listener = listener
        self._on_busy = on_busy
        self.count = count
        self.first_wait = first_wait
        self.log_every = log_every
        self.busy = 0
        self.waiting = 0
        self._free = count
        self._queue: list[tuple[float, int, _Waiter]] = []
        self._order = itertools.count()
        self._unlogged = 0
        self._logged_at = -math.inf

    @property
    def held(self) -> int:
        return self.count - self._free

    async def take(self, arrival: float, *, first: bool = False) -> None:
        """Wait for a turn, ahead of anyone who arrived after ARRIVAL. The FIRST turn of a
        connection raises Busy (and counts it) if it has not come within `first_wait`."""
        if self._free > 0:
            # Free turns mean nobody waits: a turn given back goes to a waiter first.
            self._free -= 1
            return
        waiter = _Waiter()
        heapq.heappush(self._queue, (arrival, next(self._order), waiter))
        self.waiting += 1
        try:
            with trio.move_on_after(self.first_wait if first else math.inf):
                await waiter.event.wait()
        except BaseException:
            self._leave(waiter)
            raise
        if not waiter.given:
            self._leave(waiter)
            self._refuse()
            raise Busy(f"{self.listener}: too busy to start a connection now")

    def give_back(self) -> None:
        while self._queue:
            _, _, waiter = heapq.heappop(self._queue)
            if not waiter.gone:
                waiter.given = True
                self.waiting -= 1
                waiter.event.set()
                return
        self._free += 1

    def _leave(self, waiter: _Waiter) -> None:
        """WAITER stops waiting; a turn it was given meanwhile passes on."""
        if waiter.given:
            self.give_back()
        else:
            waiter.gone = True
            self.waiting -= 1

    def _refuse(self) -> None:
        self.busy += 1
        if self._on_busy is not None:
            self._on_busy()
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at >= self.log_every:
            log.warning(
                "%s: closed %d new connection(s) before their TLS handshake since the last"
                " report: none got a turn within %g s (%d waiting); their nodes try again"
                " later or elsewhere",
                self.listener,
                self._unlogged,
                self.first_wait,
                self.waiting,
            )
            self._unlogged = 0
            self._logged_at = now


class HandshakeStream(trio.abc.Stream):
    """A TCP stream under an SSLStream: until `handshake_done`, each read that brings bytes
    waits for a turn from TURNS (shared by the listener's connections)."""

    def __init__(self, inner: trio.SocketStream, turns: Turns) -> None:
        self.inner = inner
        self._turns = turns
        self._arrival = trio.current_time()
        self._holding = False
        self._gated = True
        self._first = True

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    def _give_back(self) -> None:
        if self._holding:
            self._holding = False
            self._turns.give_back()

    def handshake_done(self) -> None:
        """From now on reads and writes go straight through."""
        self._give_back()
        self._gated = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self._give_back()
        data = await self.inner.receive_some(max_bytes)
        if self._gated and data:
            first, self._first = self._first, False
            await self._turns.take(self._arrival, first=first)
            self._holding = True
        return data

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self._give_back()
        await self.inner.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        self.handshake_done()
        await self.inner.aclose()
