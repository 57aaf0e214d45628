"""Turns at the Trio thread for TLS handshakes, so a crowd of them cannot stall the edge.

Each step of a TLS handshake (the peer's bytes in, a millisecond or so of cryptography,
the answer out) runs on the server's one Trio thread, and Trio runs every task that is
ready before it looks at its timers again: when a thousand nodes reconnect at once, every
stream's heartbeat, every block and the server's own membership heartbeat would wait
behind a thousand such steps. A connection takes a turn once its peer's bytes are in and
gives it back at its next read or write, so at most TURNS steps run between two looks at
the timers. Waiting for the network holds no turn: a peer that sends nothing, or stalls
halfway, keeps nobody else waiting.
"""

from __future__ import annotations

import trio

TURNS = 16


class HandshakeStream(trio.abc.Stream):
    """A TCP stream under an SSLStream: until `handshake_done`, each read that brings bytes
    waits for a turn from TURNS (a semaphore shared by the listener's connections)."""

    def __init__(self, inner: trio.SocketStream, turns: trio.Semaphore) -> None:
        self.inner = inner
        self._turns = turns
        self._holding = False
        self._gated = True

    @property
    def socket(self) -> trio.socket.SocketType:
        return self.inner.socket

    def _give_back(self) -> None:
        if self._holding:
            self._holding = False
            self._turns.release()

    def handshake_done(self) -> None:
        """From now on reads and writes go straight through."""
        self._give_back()
        self._gated = False

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        self._give_back()
        data = await self.inner.receive_some(max_bytes)
        if self._gated and data:
            await self._turns.acquire()
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
