"""Purge, the agent's side (docs/node-protocol.md, "Purge"), against the fake edge on MockClock.

The fake edge holds the CA key: it signs valid commands as the real edge does, and forges
them (another key, another cluster or node, another connection's challenge, a nonce used
before). A valid command deletes DIR and the launcher and ends the agent with `Purged`;
anything else is answered `purge_refused`, and every file stays.
"""

from __future__ import annotations

import base64
import itertools
import json
import logging
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from fixtures.fake_edges import (
    EdgeSession,
    FakeCluster,
    FakeNet,
    fake_net,
    join_and_stop,
    read_json,
    run_agent,
    serve_fake_edge,
)
from oz0 import pki
from oz0_common.files import write_private
from oz0_node import agent, commands, purge
from oz0_node.errors import AgentError
from oz0_node.main import console_script
from oz0_node.purge import Purged

REPO = Path(__file__).resolve().parent.parent
EDGE = "edge-a:7443"
OTHER_NODE = "node-ffffffffffff"


@pytest.fixture
async def net(nursery: trio.Nursery) -> FakeNet:
    return fake_net(nursery, EDGE)


def _command(event_detail: dict[str, str]) -> dict[str, Any]:
    """The command inside a `purge` message the fake edge sent."""
    command = json.loads(base64.b64decode(event_detail["command"]))
    assert isinstance(command, dict)
    return command


def _answers(net: FakeNet) -> list[dict[str, Any]]:
    return [e.detail for e in net.cluster.of_kind("purge-answer")]


def _launcher(tmp_path: Path, name: str = "oz0-node") -> Path:
    path = tmp_path / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text('#!/bin/sh\nexec oz0-node "$@"\n')
    return path


def _assert_identity_intact(data: Path, node_id: str) -> None:
    identity = data / "identity"
    for name in ("node.key", "node.crt", "ca.crt"):
        assert (identity / name).is_file(), name
    assert read_json(identity / "node.json")["node_id"] == node_id


async def _answer_then_stop(
    net: FakeNet, opts: agent.StartOptions, answers: int = 1
) -> list[dict[str, Any]]:
    """Run the agent until it has answered ANSWERS purge commands and was refused after the
    last (it is on its way to the next attempt); the answers."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_agent, net, opts)
        await net.cluster.wait_for("purge-answer", answers)
        await net.cluster.wait_for("connect", answers + 1)
        nursery.cancel_scope.cancel()
    return _answers(net)[:answers]


# --- a valid command --------------------------------------------------------------------


async def test_a_purge_instead_of_welcome_deletes_dir_and_launcher_and_ends_the_agent(
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    launcher = _launcher(tmp_path)
    net.cluster.set_state(node_id, "purging")
    caplog.set_level(logging.INFO)
    purged = await run_agent(net, agent.StartOptions(data_dir=data, launcher=launcher))
    assert purged == Purged(node_id=node_id, data_dir=data, launcher=launcher)
    assert purged.summary() == f"node {node_id} purged: deleted {data} and {launcher}"
    (sent,) = net.cluster.of_kind("purge-sent")
    assert _answers(net) == [{"type": "purged", "nonce": _command(sent.detail)["nonce"]}]
    assert net.cluster.of_kind("welcome") == []
    assert node_id not in net.cluster.nodes
    # After `forgotten`, at once: not after the 10 s an unconfirmed purge waits.
    assert trio.current_time() - sent.at < 1
    assert not data.exists()
    assert not launcher.exists()
    assert launcher.parent.is_dir()
    assert caplog.records[-1].getMessage() == f"node {node_id} purged: deleted {data}"


async def test_a_purge_on_a_live_stream_deletes_dir_and_the_remembered_launcher(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    data = tmp_path / "node"
    launcher = _launcher(tmp_path)
    default = _launcher(tmp_path, "default-launcher")
    node_id = await join_and_stop(net, data, launcher=launcher)
    assert read_json(data / "identity" / "node.json")["launcher"] == str(launcher)

    async def purge_once_welcomed() -> None:
        await net.cluster.wait_for("welcome")
        await trio.sleep(7)  # heartbeats flow meanwhile
        net.cluster.set_state(node_id, "purging")

    nursery.start_soon(purge_once_welcomed)
    # Started without --launcher: node.json remembers it, and it wins over the default.
    opts = agent.StartOptions(data_dir=data, default_launcher=default)
    purged = await run_agent(net, opts)
    assert purged == Purged(node_id=node_id, data_dir=data, launcher=launcher)
    (welcome,) = net.cluster.of_kind("welcome")
    (sent,) = net.cluster.of_kind("purge-sent")
    assert sent.at == pytest.approx(welcome.at + 7)
    assert _command(sent.detail)["node_id"] == node_id
    assert _answers(net) == [{"type": "purged", "nonce": _command(sent.detail)["nonce"]}]
    assert not data.exists()
    assert not launcher.exists()
    assert default.exists()


async def test_without_a_remembered_launcher_the_default_one_is_deleted(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    default = _launcher(tmp_path)
    net.cluster.set_state(node_id, "purging")
    purged = await run_agent(net, agent.StartOptions(data_dir=data, default_launcher=default))
    assert purged.launcher == default
    assert not default.exists()


async def test_without_any_launcher_only_dir_is_deleted(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.set_state(node_id, "purging")
    purged = await run_agent(net, agent.StartOptions(data_dir=data))
    assert purged == Purged(node_id=node_id, data_dir=data, launcher=None)
    assert purged.summary() == f"node {node_id} purged: deleted {data}"
    assert not data.exists()


@pytest.mark.parametrize(("after_purged", "waited"), [("silence", 10.0), ("close", 0.0)])
async def test_without_forgotten_the_files_go_after_10_s_or_when_the_edge_closes(
    after_purged: Any,
    waited: float,
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    net.cluster.set_state(node_id, "purging")
    net.cluster.after_purged = after_purged
    present_meanwhile: list[bool] = []

    async def look_before_the_deadline() -> None:
        answer = await net.cluster.wait_for("purge-answer")
        await trio.sleep_until(answer.at + commands.FORGOTTEN_TIMEOUT - 0.5)
        present_meanwhile.append(data.exists())

    if waited:
        nursery.start_soon(look_before_the_deadline)
    purged = await run_agent(net, agent.StartOptions(data_dir=data))
    (answer,) = net.cluster.of_kind("purge-answer")
    assert answer.detail["type"] == "purged"
    assert trio.current_time() - answer.at == pytest.approx(waited, abs=0.01)
    assert present_meanwhile == ([True] if waited else [])
    assert purged.node_id == node_id
    assert not data.exists()


# --- forged and wrong commands ----------------------------------------------------------

Forge = Callable[[FakeCluster, EdgeSession, str], dict[str, str]]


def _other_key(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id), key=pki.new_private_key())


def _other_cluster(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id, cluster="elsewhere"))


def _other_node(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id, node_id=OTHER_NODE))


def _other_challenge(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id, challenge="ab" * 32))


def _other_action(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id, action="reboot"))


def _short_nonce(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(c.purge_fields(s, node_id, nonce="abc123"))


def _not_json(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return c.sign(b"purge everything, please")


def _not_base64(c: FakeCluster, s: EdgeSession, node_id: str) -> dict[str, str]:
    return {**c.signed_purge(s, node_id), "signature": "not base64!"}


@pytest.mark.parametrize(
    ("forge", "reason", "echoes_nonce"),
    [
        (_other_key, "signature does not verify with the cluster CA", True),
        (_other_cluster, "command names cluster elsewhere, this node belongs to test", True),
        (_other_node, "command names node node-ffffffffffff, this is node {node_id}", True),
        (_other_challenge, "command was signed for another connection", True),
        (_other_action, "malformed command: action is 'reboot', not 'purge'", True),
        (_short_nonce, "malformed command: nonce is not 32 hex digits", False),
        (_not_json, "malformed command: not a JSON object", False),
        (_not_base64, "malformed command: command or signature is not base64", False),
    ],
)
async def test_a_wrong_command_is_refused_files_stay_and_the_agent_asks_again(
    forge: Forge,
    reason: str,
    echoes_nonce: bool,
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = tmp_path / "node"
    launcher = _launcher(tmp_path)
    node_id = await join_and_stop(net, data, launcher=launcher)
    net.cluster.set_state(node_id, "purging")
    net.cluster.purge_command = lambda s, n: forge(net.cluster, s, n)
    (answer,) = await _answer_then_stop(net, agent.StartOptions(data_dir=data))
    sent = net.cluster.of_kind("purge-sent")[0]
    nonce = json.loads(base64.b64decode(sent.detail["command"]))["nonce"] if echoes_nonce else None
    expected = reason.format(node_id=node_id)
    assert answer == {"type": "purge_refused", "nonce": nonce, "reason": expected}
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"refused a purge command from edge {EDGE}: {expected}"
    ]
    _assert_identity_intact(data, node_id)
    assert launcher.exists()
    # Refused `purging` (after the refusal) is taken like `blocked`: the same edge, soon;
    # but nothing is written to the identity the purge was refused over.
    assert read_json(data / "identity" / "node.json")["state"] == "accepted"
    first, second = net.cluster.of_kind("connect")[:2]
    assert (first.edge, second.edge) == (EDGE, EDGE)
    assert 0 < second.at - first.at <= 5.0


async def test_a_command_signed_by_the_ca_an_edge_offers_in_hello_is_refused(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    impostor = pki.new_ca(net.cluster.name, "cluster")
    net.cluster.edges[EDGE].hello_ca_pem = pki.cert_to_pem(impostor.cert)
    net.cluster.set_state(node_id, "purging")
    net.cluster.purge_command = lambda s, n: net.cluster.sign(
        net.cluster.purge_fields(s, n), key=impostor.key
    )
    (answer,) = await _answer_then_stop(net, agent.StartOptions(data_dir=data))
    assert answer["reason"] == "signature does not verify with the cluster CA"
    _assert_identity_intact(data, node_id)


async def test_a_command_captured_on_one_connection_is_refused_on_the_next(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    captured: list[dict[str, str]] = []

    def replay(s: EdgeSession, n: str) -> dict[str, str]:
        if not captured:
            # Valid on this connection; kept back, and a forgery sent instead.
            captured.append(net.cluster.signed_purge(s, n))
            return _other_key(net.cluster, s, n)
        if len(captured) == 1:
            captured.append(captured[0])
            return captured[0]
        return net.cluster.signed_purge(s, n)

    net.cluster.purge_command = replay
    net.cluster.set_state(node_id, "purging")
    purged = await run_agent(net, agent.StartOptions(data_dir=data))
    assert [(a["type"], a.get("reason")) for a in _answers(net)] == [
        ("purge_refused", "signature does not verify with the cluster CA"),
        ("purge_refused", "command was signed for another connection"),
        ("purged", None),
    ]
    assert _answers(net)[1]["nonce"] == _command(captured[0])["nonce"]
    # Each refusal is followed by another try on the same edge, within 5 s.
    connects = [e.at for e in net.cluster.of_kind("connect")]
    assert len(connects) == 3
    assert all(0 < b - a <= 5.0 for a, b in itertools.pairwise(connects))
    assert purged.node_id == node_id
    assert not data.exists()


async def test_a_nonce_seen_before_is_refused_in_the_same_run_and_after_a_restart(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    nonce = "0123456789abcdef" * 2
    # The command for each delivery, by how many the node has answered so far.
    deliveries: list[dict[str, str]] = [
        {"cluster": "elsewhere", "nonce": nonce},  # signed, refused: its nonce is seen
        {"nonce": nonce},  # valid but for the nonce: refused from memory
        {"nonce": nonce.upper()},  # after a restart: refused from DIR/purge-nonces
        {},  # a fresh nonce: purged
    ]
    net.cluster.purge_command = lambda s, n: net.cluster.sign(
        net.cluster.purge_fields(s, n, **deliveries[len(_answers(net))])
    )
    net.cluster.set_state(node_id, "purging")
    answers = await _answer_then_stop(net, agent.StartOptions(data_dir=data), answers=2)
    assert [a["reason"] for a in answers] == [
        "command names cluster elsewhere, this node belongs to test",
        "nonce already seen",
    ]
    assert answers[1]["nonce"] == nonce
    nonces = data / purge.NONCES_FILE
    assert nonces.read_text().split() == [nonce]
    assert nonces.stat().st_mode & 0o777 == 0o600
    _assert_identity_intact(data, node_id)

    purged = await run_agent(net, agent.StartOptions(data_dir=data))
    assert [(a["type"], a.get("reason")) for a in _answers(net)[2:]] == [
        ("purge_refused", "nonce already seen"),
        ("purged", None),
    ]
    assert purged.node_id == node_id
    assert not data.exists()


def test_seen_nonces_keep_the_newest_thousand(tmp_path: Path) -> None:
    seen = purge.PurgeMemory.load(tmp_path)
    nonces = [f"{i:032x}" for i in range(purge.MAX_NONCES + 5)]
    for nonce in nonces:
        seen.add(nonce)
    again = purge.PurgeMemory.load(tmp_path)
    assert (tmp_path / purge.NONCES_FILE).read_text().split() == nonces[5:]
    assert nonces[4] not in again
    assert nonces[5] in again
    assert nonces[-1].upper() in again


# --- what gets deleted, and what never does ---------------------------------------------


async def test_symbolic_links_inside_dir_are_removed_and_never_followed(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    outside_file = tmp_path / "precious.txt"
    outside_file.write_text("also mine")
    (data / "to-a-dir").symlink_to(outside, target_is_directory=True)
    (data / "identity" / "to-a-file").symlink_to(outside_file)
    (data / "sub").mkdir()
    (data / "sub" / "to-a-dir-too").symlink_to(outside, target_is_directory=True)
    net.cluster.set_state(node_id, "purging")
    await run_agent(net, agent.StartOptions(data_dir=data))
    assert not data.exists()
    assert (outside / "keep.txt").read_text() == "mine"
    assert outside_file.read_text() == "also mine"


async def test_a_symbolic_link_as_launcher_is_removed_and_its_target_kept(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    target = _launcher(tmp_path, "real-oz0-node")
    link = tmp_path / "bin" / "oz0-node"
    link.symlink_to(target)
    net.cluster.set_state(node_id, "purging")
    purged = await run_agent(net, agent.StartOptions(data_dir=data, launcher=link))
    assert purged.launcher == link
    assert not link.is_symlink()
    assert target.is_file()


def test_a_directory_as_launcher_is_never_deleted(tmp_path: Path) -> None:
    launcher = tmp_path / "bin"
    (launcher / "oz0-node").parent.mkdir()
    (launcher / "oz0-node").write_text("x")
    assert purge.delete_launcher(launcher) is None
    assert (launcher / "oz0-node").exists()
    assert purge.delete_launcher(tmp_path / "gone") is None


@pytest.mark.parametrize("change", ["missing", "another node"])
async def test_a_dir_without_the_commands_identity_refuses_the_purge(
    change: str,
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    nursery: trio.Nursery,
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    record = data / "identity" / "node.json"

    async def change_identity_then_purge() -> None:
        await net.cluster.wait_for("welcome")
        if change == "missing":
            record.unlink()
        else:
            record.write_text(json.dumps({**read_json(record), "node_id": OTHER_NODE}))
        net.cluster.set_state(node_id, "purging")

    nursery.start_soon(change_identity_then_purge)
    (answer,) = await _answer_then_stop(net, agent.StartOptions(data_dir=data))
    assert answer["type"] == "purge_refused"
    assert answer["reason"] == (
        f"{data} holds no node identity"
        if change == "missing"
        else f"{data} holds the identity of node {OTHER_NODE}, not of node {node_id}"
    )
    assert (data / "identity" / "node.key").is_file()
    assert (data / "identity" / "node.crt").is_file()


async def test_an_identity_gone_between_purged_and_deleting_stops_the_agent_deleting_nothing(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock, nursery: trio.Nursery
) -> None:
    data = tmp_path / "node"
    launcher = _launcher(tmp_path)
    node_id = await join_and_stop(net, data, launcher=launcher)
    net.cluster.after_purged = "silence"
    net.cluster.set_state(node_id, "purging")

    async def swap_identity_while_waiting_for_forgotten() -> None:
        await net.cluster.wait_for("purge-answer")
        (data / "identity" / "node.json").unlink()

    nursery.start_soon(swap_identity_while_waiting_for_forgotten)
    with pytest.raises(AgentError) as caught:
        await run_agent(net, agent.StartOptions(data_dir=data))
    assert str(caught.value) == (
        f"node {node_id} was purged, but nothing was deleted: {data} holds no node identity"
    )
    assert (data / "identity" / "node.key").is_file()
    assert launcher.exists()


async def test_a_dir_that_is_a_symbolic_link_refuses_the_purge(
    net: FakeNet, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    real = tmp_path / "real-node"
    real.mkdir()
    data = tmp_path / "node"
    data.symlink_to(real, target_is_directory=True)
    node_id = await join_and_stop(net, data)
    net.cluster.set_state(node_id, "purging")
    (answer,) = await _answer_then_stop(net, agent.StartOptions(data_dir=data))
    assert answer["reason"] == f"{data} is a symbolic link; a purge does not delete through one"
    assert data.is_symlink()
    _assert_identity_intact(real, node_id)


async def test_a_platform_whose_rmtree_follows_links_refuses_the_purge(
    net: FakeNet,
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    monkeypatch.setattr(shutil.rmtree, "avoids_symlink_attacks", False)
    net.cluster.set_state(node_id, "purging")
    (answer,) = await _answer_then_stop(net, agent.StartOptions(data_dir=data))
    assert answer["reason"] == (
        f"this platform cannot delete {data} without risk of following symbolic links out of it"
    )
    _assert_identity_intact(data, node_id)


# --- the launcher's default, and the process ---------------------------------------------


def test_only_the_oz0_node_console_script_is_a_default_launcher(tmp_path: Path) -> None:
    assert console_script("/usr/local/bin/oz0-node") == Path("/usr/local/bin/oz0-node")
    assert console_script(str(REPO / "oz0_node" / "main.py")) is None
    assert console_script("/usr/bin/oz0-node-wrapper") is None
    assert console_script(sys.executable) is None


async def test_the_agent_process_exits_0_once_purged_saying_what_it_deleted(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    cluster = FakeCluster()
    address = await serve_fake_edge(cluster, nursery)
    data = tmp_path / "node"
    launcher = _launcher(tmp_path)
    token_file = tmp_path / "join-token"
    write_private(token_file, b"good-token")
    command = [
        sys.executable, "-m", "oz0_node.main", "start", "--edge", address,
        "--ca-hash", cluster.ca_hash, "--token-file", str(token_file),
        "--launcher", str(launcher), "--data-dir", str(data),
    ]  # fmt: skip
    log = tmp_path / "agent.log"
    with trio.fail_after(60), log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            command, stdout=subprocess.PIPE, stderr=stderr, cwd=REPO
        )
        try:
            welcome = await cluster.wait_for("welcome")
            cluster.set_state(welcome.detail, "purging")
            assert process.stdout is not None
            out = b""
            async for chunk in process.stdout:
                out += chunk
            code = await process.wait()
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGKILL)
                await process.wait()
    assert code == 0, log.read_text()
    assert out.decode() == f"node {welcome.detail} purged: deleted {data} and {launcher}\n"
    assert not data.exists()
    assert not launcher.exists()
