"""The node's identity on disk: what is written, with which modes, and what is refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import trio
import trio.testing

from fixtures.fake_edges import GOOD_TOKEN, FakeCluster, FakeNet, join_and_stop, options, read_json
from oz0 import pki
from oz0_node import agent
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir, NodeRecord


def _mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


def test_the_node_key_is_made_once_0600_and_never_replaced(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    key = identity.load_or_create_key()
    pem = identity.key_path.read_bytes()
    assert _mode(identity.key_path) == 0o600
    assert _mode(identity.root) == 0o700
    again = identity.load_or_create_key()
    assert identity.key_path.read_bytes() == pem
    assert again.private_numbers() == key.private_numbers()


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_node_key_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    identity.load_or_create_key()
    identity.key_path.chmod(mode)
    with pytest.raises(AgentError, match=f"mode {mode:04o}.*chmod 600"):
        identity.load_or_create_key()


async def test_a_joined_node_keeps_its_identity_in_private_files(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    net = FakeNet(cluster, nursery)
    data = tmp_path / "node"
    async with trio.open_nursery() as inner:
        inner.start_soon(
            lambda: agent.run(
                options(data, cluster, token=GOOD_TOKEN),
                open_stream=net.open_stream,
                rng=random.Random(1),
            )
        )
        await cluster.wait_for("welcome")
        inner.cancel_scope.cancel()
    root = data / "identity"
    assert _mode(root) == 0o700
    assert sorted(p.name for p in root.iterdir()) == ["ca.crt", "node.crt", "node.json", "node.key"]
    for path in root.iterdir():
        assert _mode(path) == 0o600, path
    record = read_json(root / "node.json")
    assert set(record) == {
        "cluster", "ca_hash", "node_id", "tenant", "state", "edges", "launcher", "max_jobs"
    }  # fmt: skip
    assert record["ca_hash"] == cluster.ca_hash
    assert _mode(data / "status.json") == 0o600


async def test_a_pending_node_keeps_its_id_and_key_but_has_no_certificate(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    net = FakeNet(cluster, nursery)
    data = tmp_path / "node"
    with trio.move_on_after(10):
        await agent.run(options(data, cluster), open_stream=net.open_stream)
    root = data / "identity"
    assert sorted(p.name for p in root.iterdir()) == ["ca.crt", "node.json", "node.key"]
    (node_id,) = cluster.nodes
    record = read_json(root / "node.json")
    assert (record["node_id"], record["state"]) == (node_id, "pending")
    # The key the cluster knows is the one on disk.
    key = pki.key_from_pem((root / "node.key").read_bytes())
    assert cluster.nodes[node_id].key.public_numbers() == key.public_key().public_numbers()


async def test_without_identity_the_first_start_needs_edge_and_ca_hash(tmp_path: Path) -> None:
    data = tmp_path / "node"
    with pytest.raises(AgentError) as caught:
        await agent.run(agent.StartOptions(data_dir=data, edges=["edge-a:7443"]))
    assert str(caught.value) == (
        f"{data} holds no node identity; to join a cluster, give --ca-hash"
    )
    with pytest.raises(AgentError, match=r"give --edge and --ca-hash$"):
        await agent.run(agent.StartOptions(data_dir=data))
    assert not data.exists()


async def test_a_different_ca_hash_than_the_stored_clusters_is_refused(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    stored = "sha256:" + "a" * 64
    identity.save_record(NodeRecord(cluster="prod", ca_hash=stored, edges=["edge-a:7443"]))
    other = "sha256:" + "b" * 64
    with pytest.raises(AgentError) as caught:
        await agent.run(agent.StartOptions(data_dir=identity.data_dir, ca_hash=other))
    assert str(caught.value) == (
        f"{identity.data_dir} belongs to cluster prod (CA {stored}), not to --ca-hash {other}"
    )


def test_one_agent_per_data_directory(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path / "node")
    identity.ensure_data_dir()
    with (
        identity.locked(),
        pytest.raises(AgentError, match="another oz0-node agent is already running"),
        IdentityDir(tmp_path / "node").locked(),
    ):
        pass
    with identity.locked():
        pass


async def test_a_certificate_without_its_node_record_is_refused_and_nothing_written(
    tmp_path: Path, nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    net = FakeNet(cluster, nursery)
    data = tmp_path / "node"
    await join_and_stop(net, data)
    root = data / "identity"
    (root / "node.json").unlink()
    before = {p.name: p.read_bytes() for p in root.iterdir()}
    with (
        pytest.raises(AgentError, match=r"holds a node certificate but no node record"),
        trio.fail_after(60),
    ):
        await agent.run(options(data, cluster, token=GOOD_TOKEN), open_stream=net.open_stream)
    assert {p.name: p.read_bytes() for p in root.iterdir()} == before
