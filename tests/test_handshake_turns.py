"""Turns for TLS handshake steps (oz0/server/edge/handshake_turns.py), on memory streams.

The real edge runs every connection through this (tests/test_edge.py and the others);
here the turns themselves: who waits for one, and who never holds one.
"""

from __future__ import annotations

from typing import cast

import trio
import trio.testing

from oz0.server.edge.handshake_turns import HandshakeStream


def gated(turns: trio.Semaphore) -> tuple[HandshakeStream, trio.abc.Stream]:
    """A gated stream and the peer's end of it."""
    ours, peer = trio.testing.memory_stream_pair()
    return HandshakeStream(cast(trio.SocketStream, ours), turns), peer


async def test_a_read_that_brings_bytes_waits_for_a_turn_until_the_holder_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = trio.Semaphore(1)
    first, first_peer = gated(turns)
    second, second_peer = gated(turns)
    await first_peer.send_all(b"hello 1")
    await second_peer.send_all(b"hello 2")
    assert await first.receive_some() == b"hello 1"
    got: list[bytes | bytearray] = []

    async def read_second() -> None:
        got.append(await second.receive_some())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(read_second)
        await trio.sleep(5)
        assert got == []  # the first holds the only turn, however long it takes
        await first.send_all(b"answer")  # its step is over
        await trio.sleep(0.1)
        assert got == [b"hello 2"]
    assert await first_peer.receive_some() == b"answer"


async def test_waiting_for_the_peer_holds_no_turn(autojump_clock: trio.testing.MockClock) -> None:
    turns = trio.Semaphore(1)
    silent, _silent_peer = gated(turns)
    talking, talking_peer = gated(turns)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(silent.receive_some)  # a peer that never sends
        await trio.sleep(1)
        await talking_peer.send_all(b"client hello")
        with trio.fail_after(1):
            assert await talking.receive_some() == b"client hello"
        nursery.cancel_scope.cancel()


async def test_after_the_handshake_reads_go_straight_through(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = trio.Semaphore(1)
    holder, holder_peer = gated(turns)
    done, done_peer = gated(turns)
    await holder_peer.send_all(b"x")
    await holder.receive_some()  # holds the only turn from now on
    done.handshake_done()
    await done_peer.send_all(b"a stream's message")
    with trio.fail_after(1):
        assert await done.receive_some() == b"a stream's message"


async def test_closing_gives_the_turn_back(autojump_clock: trio.testing.MockClock) -> None:
    turns = trio.Semaphore(1)
    holder, holder_peer = gated(turns)
    await holder_peer.send_all(b"x")
    await holder.receive_some()
    assert turns.value == 0
    await holder.aclose()
    assert turns.value == 1
