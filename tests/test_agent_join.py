"""Joining against a fake edge on in-memory streams, on MockClock: pin, join, pickup."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.fake_edges import (
    EXPIRED_TOKEN,
    GOOD_TOKEN,
    FakeCluster,
    FakeNet,
    LongestWait,
    options,
    read_json,
)
from oz0 import pki
from oz0_node import agent
from oz0_node.errors import AgentError


def _start(nursery: trio.Nursery, net: FakeNet, opts: agent.StartOptions) -> None:
    nursery.start_soon(_run, net, opts)


async def _run(net: FakeNet, opts: agent.StartOptions) -> None:
    """The agent, until it fails or the test cancels it; a test never lasts 1000 s of Trio time."""
    with trio.fail_after(1000):
        await agent.run(opts, open_stream=net.open_stream, rng=LongestWait())


async def test_a_ca_hash_mismatch_stops_before_anything_is_sent_or_written(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    wrong = "sha256:" + "0" * 64
    with pytest.raises(AgentError) as caught:
        await _run(net, options(tmp_path / "node", net.cluster, ca_hash=wrong))
    assert str(caught.value) == (
        f"CA hash mismatch: edge edge-a:7443 presented {net.cluster.ca_hash}, expected {wrong}"
    )
    assert net.cluster.of_kind("join") == []
    assert not (tmp_path / "node" / "identity").exists()


async def test_a_token_join_writes_the_identity_and_opens_the_control_stream(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    only_a = options(data, net.cluster, edges=["edge-a:7443"], token=GOOD_TOKEN, labels={"k": "v"})
    async with trio.open_nursery() as nursery:
        _start(nursery, net, only_a)
        await net.cluster.wait_for("welcome")
        nursery.cancel_scope.cancel()

    (join,) = net.cluster.of_kind("join")
    assert join.detail["token"] == GOOD_TOKEN
    assert join.detail["labels"] == {"k": "v"}
    assert join.detail["hostname"] == "test-host"
    (node_id,) = net.cluster.nodes
    identity = data / "identity"
    cert = pki.cert_from_pem((identity / "node.crt").read_bytes())
    key = pki.key_from_pem((identity / "node.key").read_bytes())
    assert cert.public_key().public_numbers() == key.public_key().public_numbers()  # type: ignore[union-attr]
    assert pki.identity_of(cert).name == node_id
    assert (identity / "ca.crt").read_bytes() == net.cluster.ca_pem
    record = read_json(identity / "node.json")
    assert record["node_id"] == node_id
    assert record["cluster"] == "test"
    assert record["tenant"] == "acme"
    assert record["state"] == "accepted"
    # The joined answer taught it edge-b as well.
    assert record["edges"] == ["edge-a:7443", "edge-b:7443"]
    # Control stream: the pinning and join connections go to /join, then /control.
    paths = [e.detail for e in net.cluster.of_kind("connect")]
    assert paths == ["/join", "/join", "/control"]


async def test_a_pending_node_picks_up_its_certificate_as_soon_as_it_is_accepted(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    async with trio.open_nursery() as nursery:
        _start(nursery, net, options(data, net.cluster))
        await net.cluster.wait_for("pickup")
        record = read_json(data / "identity" / "node.json")
        (node_id,) = net.cluster.nodes
        assert record["node_id"] == node_id
        assert record["state"] == "pending"
        assert not (data / "identity" / "node.crt").exists()
        assert read_json(data / "status.json")["state"] == "pending"

        # Held for 30 s, answered pending, asked again: still waiting after 100 s.
        await trio.sleep(100)
        pickups = [e.at for e in net.cluster.of_kind("pickup")]
        assert len(pickups) == 4
        # Each held 30 s, answered pending, asked again after the shortest wait (0.2 s).
        assert [b - a for a, b in itertools.pairwise(pickups)] == pytest.approx([30.2] * 3)
        assert net.cluster.of_kind("bad-signature") == []
        accepted_at = trio.current_time()
        net.cluster.accept(node_id)
        welcome = await net.cluster.wait_for("welcome")
        nursery.cancel_scope.cancel()

    # The held pickup answered at once; the control stream followed without delay.
    assert welcome.at == pytest.approx(accepted_at)
    assert (data / "identity" / "node.crt").exists()
    assert read_json(data / "identity" / "node.json")["state"] == "accepted"
    assert len(net.cluster.of_kind("join")) == 1


async def test_a_pending_node_resumes_with_pickup_and_the_same_key(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    with trio.move_on_after(5):
        await _run(net, options(data, net.cluster))
    key_pem = (data / "identity" / "node.key").read_bytes()
    (node_id,) = net.cluster.nodes

    async with trio.open_nursery() as nursery:
        _start(nursery, net, agent.StartOptions(data_dir=data))
        await net.cluster.wait_for("pickup", len(net.cluster.of_kind("pickup")) + 1)
        net.cluster.accept(node_id)
        await net.cluster.wait_for("welcome")
        nursery.cancel_scope.cancel()
    assert len(net.cluster.of_kind("join")) == 1
    assert (data / "identity" / "node.key").read_bytes() == key_pem


async def test_a_rejected_node_stops_with_the_reason(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"

    async def reject_when_waiting() -> None:
        await net.cluster.wait_for("pickup")
        (node_id,) = net.cluster.nodes
        net.cluster.reject(node_id, "not one of ours")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reject_when_waiting)
        with pytest.raises(AgentError) as caught:
            await _run(net, options(data, net.cluster))
    (node_id,) = net.cluster.nodes
    assert str(caught.value) == f"node {node_id} was rejected: not one of ours"
    assert read_json(data / "identity" / "node.json")["state"] == "rejected"

    with pytest.raises(AgentError, match=f"node {node_id} was rejected"):
        await _run(net, agent.StartOptions(data_dir=data))


async def test_a_refused_token_stops_with_its_message(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    with pytest.raises(AgentError, match=r"^join token refused: join token expired$"):
        await _run(net, options(tmp_path / "node", net.cluster, token=EXPIRED_TOKEN))


async def test_an_unreachable_edge_is_skipped_for_the_next_one(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    net.down.add("edge-a:7443")
    async with trio.open_nursery() as nursery:
        _start(nursery, net, options(tmp_path / "node", net.cluster, token=GOOD_TOKEN))
        await net.cluster.wait_for("welcome")
        nursery.cancel_scope.cancel()
    tried = [address for address, _ in net.attempts]
    # pin: a (down), b; join: a (down), b; control: a (down), b.
    assert tried == ["edge-a:7443", "edge-b:7443"] * 3
    assert {e.edge for e in net.cluster.events} == {"edge-b:7443"}


@pytest.mark.parametrize("impostor", ["node-role", "other-ca"])
async def test_an_edge_without_a_server_certificate_of_the_pinned_ca_gets_no_join(
    impostor: str, tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = FakeCluster()
    if impostor == "node-role":
        cluster.add_edge("edge-a:7443", role=pki.Role.NODE)
    else:
        cluster.add_edge("edge-a:7443", ca=pki.new_ca("test", "cluster"))
    net = FakeNet(cluster, nursery)
    with trio.move_on_after(60):
        await _run(net, options(tmp_path / "node", cluster, token=GOOD_TOKEN))
    # It pinned (the hello carries the right CA), then refused every verified connection.
    assert (tmp_path / "node" / "identity" / "ca.crt").exists()
    assert len(net.attempts) > 10
    assert cluster.of_kind("join") == []
    assert [e.detail for e in cluster.of_kind("connect")] == ["/join"]
