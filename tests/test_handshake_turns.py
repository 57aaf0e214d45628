"""Turns for TLS handshake steps (oz0/server/edge/handshake_turns.py), on memory streams.

The real edge runs every connection through this (tests/test_edge.py and the others);
here the turns themselves: who waits for one, and who never holds one.
"""

from __future__ import annotations

from typing import cast

import pytest
import trio
import trio.testing

from oz0.server.edge.handshake_turns import Busy, HandshakeStream, Turns


def gated(turns: Turns) -> tuple[HandshakeStream, trio.abc.Stream]:
    """A gated stream and the peer's end of it."""
    ours, peer = trio.testing.memory_stream_pair()
    return HandshakeStream(cast(trio.SocketStream, ours), turns), peer


async def test_a_read_that_brings_bytes_waits_for_a_turn_until_the_holder_writes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = Turns("edge test", 1, first_wait=60)
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
    turns = Turns("edge test", 1)
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
    turns = Turns("edge test", 1)
    holder, holder_peer = gated(turns)
    done, done_peer = gated(turns)
    await holder_peer.send_all(b"x")
    await holder.receive_some()  # holds the only turn from now on
    done.handshake_done()
    await done_peer.send_all(b"a stream's message")
    with trio.fail_after(1):
        assert await done.receive_some() == b"a stream's message"


async def test_closing_gives_the_turn_back(autojump_clock: trio.testing.MockClock) -> None:
    turns = Turns("edge test", 1)
    holder, holder_peer = gated(turns)
    await holder_peer.send_all(b"x")
    await holder.receive_some()
    assert turns.held == 1
    await holder.aclose()
    assert turns.held == 0


async def test_turns_go_to_the_connection_accepted_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = Turns("edge test", 1, first_wait=60)
    holder, holder_peer = gated(turns)
    # Accepted in this order; their bytes arrive in the opposite one.
    streams = []
    for _ in range(3):
        await trio.sleep(0.1)
        streams.append(gated(turns))
    await holder_peer.send_all(b"x")
    await holder.receive_some()
    order: list[int] = []

    async def read(i: int) -> None:
        stream, _ = streams[i]
        await stream.receive_some()
        order.append(i)
        await stream.send_all(b"step done")

    async with trio.open_nursery() as nursery:
        for i in (2, 1, 0):
            nursery.start_soon(read, i)
            await streams[i][1].send_all(b"client hello")
            await trio.sleep(0.1)
        assert turns.waiting == 3
        await holder.send_all(b"answer")
    assert order == [0, 1, 2]


async def test_a_first_turn_that_does_not_come_in_time_closes_the_connection(
    autojump_clock: trio.testing.MockClock,
) -> None:
    shed: list[None] = []
    turns = Turns("edge test", 1, first_wait=2.0, on_busy=lambda: shed.append(None))
    holder, holder_peer = gated(turns)
    late, late_peer = gated(turns)
    await holder_peer.send_all(b"x")
    await holder.receive_some()
    await late_peer.send_all(b"client hello")
    began = trio.current_time()
    with pytest.raises(Busy):
        await late.receive_some()
    assert trio.current_time() - began == 2.0
    assert shed == [None] and turns.busy == 1 and turns.waiting == 0
    # The turn given back later goes to nobody who left: it is free again.
    await holder.send_all(b"answer")
    assert turns.held == 0


async def test_later_turns_of_a_begun_handshake_wait_without_a_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = Turns("edge test", 1, first_wait=2.0)
    begun, begun_peer = gated(turns)
    holder, holder_peer = gated(turns)
    await begun_peer.send_all(b"client hello")
    await begun.receive_some()
    await begun.send_all(b"server hello")  # its first step is done
    await holder_peer.send_all(b"x")
    await holder.receive_some()
    await begun_peer.send_all(b"client finished")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(begun.receive_some)
        await trio.sleep(10)
        assert turns.waiting == 1
        await holder.send_all(b"answer")
        await trio.sleep(0.1)
        assert turns.waiting == 0 and turns.held == 1


async def test_a_waiter_cancelled_after_it_was_given_the_turn_passes_it_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    turns = Turns("edge test", 1, first_wait=60)
    await turns.take(0.0)
    got: list[str] = []

    async def wait_for_turn(name: str, arrival: float) -> None:
        await turns.take(arrival)
        got.append(name)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            cancelled = trio.CancelScope()

            async def first_in_line() -> None:
                with cancelled:
                    await wait_for_turn("first", 1.0)

            nursery.start_soon(first_in_line)
            nursery.start_soon(wait_for_turn, "second", 2.0)
            await trio.sleep(0.1)
            # The first is cancelled, and given the turn before it runs again.
            cancelled.cancel()
            turns.give_back()
    assert got == ["second"] and turns.held == 1 and turns.waiting == 0
