"""The control stream against a fake edge on in-memory streams, on MockClock."""

from __future__ import annotations

import itertools
import random
from functools import partial
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.fake_edges import (
    EdgeSession,
    FakeNet,
    join_and_stop,
    read_json,
    run_agent,
)
from oz0_node import agent
from oz0_node.errors import AgentError


def _heartbeats_from_node(net: FakeNet) -> list[float]:
    return [e.at for e in net.cluster.of_kind("from-node") if e.detail == {"type": "heartbeat"}]


async def test_welcome_marks_the_node_connected_and_heartbeats_flow_every_interval(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.heartbeat = 2.5
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        welcome = await net.cluster.wait_for("welcome")
        await trio.testing.wait_all_tasks_blocked()
        status = read_json(data / "status.json")
        assert status["node_id"] == node_id
        assert status["cluster"] == "test"
        assert status["state"] == "accepted"
        assert status["connected"] is True
        assert status["server"] == "server-edge-a"
        await trio.sleep(61)
        nursery.cancel_scope.cancel()
    beats = _heartbeats_from_node(net)
    assert beats == pytest.approx([welcome.at + 2.5 * i for i in range(1, len(beats) + 1)])
    assert len(beats) == 24
    # One stream all along: the edge's own heartbeats kept it alive.
    assert len(net.cluster.of_kind("welcome")) == 1
    assert read_json(data / "status.json")["connected"] is False


async def test_three_silent_heartbeat_intervals_end_the_stream_and_it_reconnects(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    net.cluster.edges["edge-a:7443"].sends_heartbeats = False
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        first = await net.cluster.wait_for("welcome")
        assert first.edge == "edge-a:7443"
        await net.cluster.wait_for("node-closed")
        closed_at = trio.current_time()
        second = await net.cluster.wait_for("welcome", 2)
        nursery.cancel_scope.cancel()
    assert closed_at == pytest.approx(first.at + 15)
    # The shortest backoff (0.2 s, jitter at its bound), then the next edge.
    assert second.edge == "edge-b:7443"
    assert second.at == pytest.approx(first.at + 15 + 0.2)


async def test_a_closed_stream_reconnects_across_edges_with_growing_waits(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)

    async def welcome_then_close(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        net.cluster.record("welcome", s.edge.address)

    for edge in net.cluster.edges.values():
        edge.on_control = welcome_then_close
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("welcome", 6)
        nursery.cancel_scope.cancel()
    welcomes = net.cluster.of_kind("welcome")
    assert [w.edge for w in welcomes] == ["edge-a:7443", "edge-b:7443"] * 3
    start = welcomes[0].at
    assert [w.at - start for w in welcomes] == pytest.approx([0, 0.2, 0.6, 1.4, 3.0, 6.2])


async def test_a_move_from_a_stopping_edge_sends_the_node_to_another_edge_at_once(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    net.cluster.add_edge("edge-c:7443")

    async def welcome_then_close(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        net.cluster.record("welcome", s.edge.address)

    async def welcome_then_move(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        net.cluster.record("welcome", s.edge.address)
        await s.send("move", edges=["edge-c:7443"], message="server x is stopping")
        await trio.sleep_forever()

    async def welcome_and_stay(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        net.cluster.record("welcome", s.edge.address)
        await trio.sleep_forever()

    # Four streams lost first, two on each (the backoff grows to 1.6 s), then A says it is
    # stopping and names C, up.
    closes = itertools.chain([welcome_then_close] * 2, itertools.repeat(welcome_then_move))

    async def on_a(s: EdgeSession) -> None:
        await next(closes)(s)

    net.cluster.edges["edge-a:7443"].on_control = on_a
    net.cluster.edges["edge-b:7443"].on_control = welcome_then_close
    net.cluster.edges["edge-c:7443"].on_control = welcome_and_stay
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("welcome", 6)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    welcomes = net.cluster.of_kind("welcome")
    assert [w.edge for w in welcomes] == ["edge-a:7443", "edge-b:7443"] * 2 + [
        "edge-a:7443",
        "edge-c:7443",
    ]
    start = welcomes[0].at
    # No wait after the move: at once to the edge it named, not A again after a backoff.
    assert [w.at - start for w in welcomes] == pytest.approx([0, 0.2, 0.6, 1.4, 3.0, 3.0])
    assert read_json(data / "identity" / "node.json")["edges"] == [
        "edge-a:7443",
        "edge-b:7443",
        "edge-c:7443",
    ]


async def test_edges_from_the_edge_are_added_to_node_json(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)
    net.cluster.add_edge("edge-c:7443")

    async def announce_edges(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        await s.send("edges", edges=["edge-c:7443", "[fd00::1]:7443", "not an address"])
        net.cluster.record("welcome", s.edge.address)
        await trio.sleep_forever()

    net.cluster.edges["edge-a:7443"].on_control = announce_edges
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("welcome")
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    assert read_json(data / "identity" / "node.json")["edges"] == [
        "edge-a:7443",
        "edge-b:7443",
        "edge-c:7443",
        "[fd00::1]:7443",
    ]


async def test_max_jobs_is_told_on_every_stream_shown_in_the_status_and_remembered(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """`--max-jobs 6`: the edge is told on each stream (placement puts no more there), the
    status shows it, and a later start without it (what the systemd unit runs) keeps it."""
    data = tmp_path / "node"
    await join_and_stop(net, data, max_jobs=6)
    for start in (1, 2):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
            await net.cluster.wait_for("welcome", start)
            await trio.sleep(1)
            jobs = read_json(data / "status.json")["jobs"]
            nursery.cancel_scope.cancel()
        assert jobs["max_jobs"] == 6
    told = [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "max_jobs"]
    assert told == [{"type": "max_jobs", "max_jobs": 6}] * 2
    assert read_json(data / "identity" / "node.json")["max_jobs"] == 6
    # Given again, it replaces what was remembered.
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data, max_jobs=2))
        await net.cluster.wait_for("welcome", 3)
        await trio.sleep(1)
        nursery.cancel_scope.cancel()
    told = [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "max_jobs"]
    assert told[-1] == {"type": "max_jobs", "max_jobs": 2}
    assert read_json(data / "identity" / "node.json")["max_jobs"] == 2


async def test_unknown_messages_are_ignored_and_the_stream_stays_up(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    await join_and_stop(net, data)

    async def chatty(s: EdgeSession) -> None:
        await s.send("welcome", node_id="x", server=s.edge.server_id, heartbeat=5, edges=[])
        net.cluster.record("welcome", s.edge.address)
        while True:
            await trio.sleep(4)
            await s.send("frobnicate", payload=[1, 2, 3])

    net.cluster.edges["edge-a:7443"].on_control = chatty
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("welcome")
        await trio.sleep(100)
        assert read_json(data / "status.json")["connected"] is True
        nursery.cancel_scope.cancel()
    assert len(net.cluster.of_kind("welcome")) == 1


async def test_a_blocked_node_asks_the_same_edge_again_and_connects_once_unblocked(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.down.add("edge-b:7443")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("welcome")
        net.cluster.set_state(node_id, "blocked")
        await net.cluster.wait_for("connect", 4)
        status = read_json(data / "status.json")
        assert (status["state"], status["connected"]) == ("blocked", False)
        assert read_json(data / "identity" / "node.json")["state"] == "blocked"
        await trio.sleep(60)
        attempts = [e.at for e in net.cluster.of_kind("connect")]
        assert all(2.0 - 1e-9 <= b - a <= 4.0 + 1e-9 for a, b in itertools.pairwise(attempts))
        # The edge that refused answers; the unreachable one is not tried meanwhile.
        assert {address for address, _ in net.attempts} == {"edge-a:7443"}
        unblocked_at = trio.current_time()
        net.cluster.set_state(node_id, "accepted")
        second = await net.cluster.wait_for("welcome", 2)
        await trio.testing.wait_all_tasks_blocked()
        assert second.at - unblocked_at <= 4.0 + 1e-9
        assert read_json(data / "status.json")["state"] == "accepted"
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("seed", [1, 2, 3])
async def test_a_node_blocked_from_the_start_keeps_its_files_and_notices_the_unblock(
    seed: int, net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    identity = data / "identity"
    files_before = {p.name: p.read_bytes() for p in identity.iterdir() if p.name != "node.json"}
    net.cluster.set_state(node_id, "blocked")
    async with trio.open_nursery() as nursery:
        # Real jitter this time: whatever it draws, the cap holds.
        nursery.start_soon(
            partial(
                agent.run,
                agent.StartOptions(data_dir=data),
                open_stream=net.open_stream,
                rng=random.Random(seed),
            )
        )
        await trio.sleep(120)
        attempts = [e.at for e in net.cluster.of_kind("connect")]
        assert len(attempts) >= 120 / 5
        assert all(0 < b - a <= 5.0 for a, b in itertools.pairwise(attempts))
        assert trio.current_time() - attempts[-1] <= 5.0
        assert net.cluster.of_kind("welcome") == []
        status = read_json(data / "status.json")
        assert (status["state"], status["connected"]) == ("blocked", False)
        assert {p.name: p.read_bytes() for p in identity.iterdir() if p.name != "node.json"} == (
            files_before
        )
        unblocked_at = trio.current_time()
        net.cluster.set_state(node_id, "accepted")
        welcome = await net.cluster.wait_for("welcome")
        await trio.testing.wait_all_tasks_blocked()
        assert welcome.at - unblocked_at <= 5.0  # the docs promise ten
        status = read_json(data / "status.json")
        assert (status["state"], status["connected"]) == ("accepted", True)
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize(
    ("state", "message"),
    [
        ("rejected", "node {} was rejected: node {} is rejected"),
        ("unknown", "the cluster does not know node {} (node {} is unknown)"),
    ],
)
async def test_a_rejected_or_unknown_node_stops_on_refusal(
    state: str,
    message: str,
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.set_state(node_id, state)
    with pytest.raises(AgentError) as caught:
        await run_agent(net, agent.StartOptions(data_dir=data))
    assert str(caught.value).startswith(message.format(node_id, node_id))
    assert read_json(data / "status.json")["connected"] is False
