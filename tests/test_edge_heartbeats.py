"""The edge's one heartbeat scheduler (oz0/server/edge/heartbeats.py), on Trio's MockClock.

The streams are fakes that record what is sent to them: what is checked here is when the
scheduler sends and when it ends a stream, not the websocket under it.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
import trio
import trio.testing

from oz0.server.edge.heartbeats import HEARTBEAT_MESSAGE, Beat, Heartbeats
from oz0.server.edge.wire import text_frame


@dataclass
class FakeStream:
    """What was sent to one stream, and when; a BLOCKED stream's socket never takes
    anything (sends wait for `drain`, which never ends), a BROKEN one fails as nothing
    else does."""

    sent: list[tuple[float, str]] = field(default_factory=list)
    blocked: bool = False
    broken: bool = False

    def send_now(self, text: str) -> bool:
        if self.broken:
            raise RuntimeError("a stream failing in an unforeseen way")
        self.sent.append((trio.current_time(), text))
        return not self.blocked

    def send_frame_now(self, frame: bytes) -> bool:
        assert frame == text_frame(HEARTBEAT_MESSAGE)
        return self.send_now(HEARTBEAT_MESSAGE)

    async def drain(self) -> None:
        if self.blocked:
            await trio.sleep_forever()

    def kinds(self) -> list[str]:
        return [json.loads(m)["type"] for _, m in self.sent]


@dataclass
class Directory:
    edges: list[str] = field(default_factory=lambda: ["127.0.0.1:7443"])


async def started(nursery: trio.Nursery, **options: Any) -> tuple[Heartbeats, Directory]:
    directory = Directory()
    heartbeats = Heartbeats(lambda: directory.edges, **options)
    await nursery.start(heartbeats.run)
    return heartbeats, directory


async def keep_heard(beat: Beat, every: float = 5.0) -> None:
    while True:
        beat.heard = trio.current_time()
        await trio.sleep(every)


async def talking_stream(
    heartbeats: Heartbeats, stream: FakeStream, scope: trio.CancelScope
) -> None:
    """A node that sends something every interval, until its stream is ended (SCOPE)."""
    with scope:
        beat = heartbeats.add(stream, "node", scope)
        try:
            await keep_heard(beat)
        finally:
            heartbeats.remove(beat)


async def test_each_stream_gets_a_heartbeat_every_interval_none_late(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, _ = await started(nursery)
        streams = [FakeStream() for _ in range(50)]
        began: list[float] = []
        for stream in streams:
            beat = heartbeats.add(stream, "node", trio.CancelScope())
            began.append(trio.current_time())
            nursery.start_soon(keep_heard, beat)
            await trio.sleep(0.1)  # streams welcomed over 5 s
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    for stream, start in zip(streams, began, strict=True):
        times = [t for t, m in stream.sent]
        assert all(m == HEARTBEAT_MESSAGE for _, m in stream.sent)
        assert 11 <= len(times) <= 13
        # The first one interval after the welcome, then one per interval, at most a tick late.
        assert 5.0 <= times[0] - start <= 5.0 + heartbeats.tick + 0.01
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert all(5.0 <= gap <= 5.0 + heartbeats.tick + 0.01 for gap in gaps), gaps


async def test_a_silent_stream_ends_after_three_intervals_and_others_stay(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, _ = await started(nursery)
        silent_scope, talking_scope = trio.CancelScope(), trio.CancelScope()
        silent = heartbeats.add(FakeStream(), "silent", silent_scope)
        talking = heartbeats.add(FakeStream(), "talking", talking_scope)
        nursery.start_soon(keep_heard, talking)
        began = trio.current_time()
        with trio.move_on_after(60), silent_scope:
            await trio.sleep_forever()
        ended_after = trio.current_time() - began
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert silent.silent and not talking.silent
    # Three intervals of silence, noticed at the next heartbeat due.
    assert 15.0 <= ended_after <= 20.0 + heartbeats.tick + 0.1
    assert not talking_scope.cancel_called


async def test_edges_go_out_within_a_tick_of_changing_in_place_of_a_heartbeat(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, directory = await started(nursery)
        streams = [FakeStream() for _ in range(3)]
        for stream in streams:
            nursery.start_soon(keep_heard, heartbeats.add(stream, "node", trio.CancelScope()))
        await trio.sleep(7)
        directory.edges = ["127.0.0.1:7443", "127.0.0.2:7443"]
        changed = trio.current_time()
        await trio.sleep(12)
        nursery.cancel_scope.cancel()
    for stream in streams:
        assert stream.kinds() == ["heartbeat", "edges", "heartbeat", "heartbeat"]
        at, message = stream.sent[1]
        assert json.loads(message)["edges"] == directory.edges
        assert at - changed <= heartbeats.tick + 0.01


async def test_a_peer_that_does_not_read_is_closed_and_does_not_hold_up_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, _ = await started(nursery, senders=2, send_timeout=10.0)
        stuck = [FakeStream(blocked=True) for _ in range(4)]
        stuck_scopes = [trio.CancelScope() for _ in stuck]
        for stream, scope in zip(stuck, stuck_scopes, strict=True):
            nursery.start_soon(talking_stream, heartbeats, stream, scope)
        fine = FakeStream()
        fine_scope = trio.CancelScope()
        nursery.start_soon(talking_stream, heartbeats, fine, fine_scope)
        await trio.sleep(60)
        nursery.cancel_scope.cancel()
    assert all(scope.cancel_called for scope in stuck_scopes)
    assert not fine_scope.cancel_called
    # The stuck ones hold both drain tasks for 10 s at a time; the fine one's heartbeats go
    # straight into its socket meanwhile, every interval, none late.
    times = [t for t, _ in fine.sent]
    assert len(times) >= 11
    assert max(b - a for a, b in itertools.pairwise(times)) <= 5.0 + heartbeats.tick + 0.01


async def test_a_removed_stream_gets_nothing_more(autojump_clock: trio.testing.MockClock) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, _ = await started(nursery)
        stream = FakeStream()
        beat = heartbeats.add(stream, "node", trio.CancelScope())
        await trio.sleep(11)
        heartbeats.remove(beat)
        assert len(heartbeats) == 0
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert len(stream.sent) == 2


@pytest.mark.parametrize("text", [HEARTBEAT_MESSAGE, '{"type":"heartbeat"}'])
def test_the_agents_heartbeat_is_recognised_without_decoding(text: str) -> None:
    from oz0.server.edge.heartbeats import HEARTBEATS
    from oz0_node.messages import encode

    assert text in HEARTBEATS
    assert encode("heartbeat") in HEARTBEATS


async def test_a_stream_that_fails_oddly_is_closed_and_the_others_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with trio.open_nursery() as nursery:
        heartbeats, _ = await started(nursery, senders=1)
        broken_scope, fine_scope = trio.CancelScope(), trio.CancelScope()
        nursery.start_soon(talking_stream, heartbeats, FakeStream(broken=True), broken_scope)
        fine = FakeStream()
        nursery.start_soon(talking_stream, heartbeats, fine, fine_scope)
        await trio.sleep(30)
        nursery.cancel_scope.cancel()
    assert broken_scope.cancel_called and not fine_scope.cancel_called
    assert len(fine.sent) >= 5
