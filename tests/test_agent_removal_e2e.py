"""Block, unblock and purge with real agents (`python -m oz0_node.main`) and real servers.

The tests share the module's server (`served`, on ADVERTISE, default ports) and look only
at their own node's rows, but the one that purges through another server: a cluster of
two of its own (`cluster_files`), on OWN_CLUSTER_ADVERTISE and NEXT. The rogue edge listens
on NEXT's 7443 (another test's, one at a time).
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from fixtures import edge_client, rogue_edge
from fixtures.agent import AgentProcess, connected
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, Served, StartServer
from fixtures.edge_client import pinned_keys
from fixtures.snapshots import snapshot
from oz0 import pki, purge_command
from oz0.context import Context, server_address
from tests.conftest import CliRunner, create_token

ADVERTISE, OWN_CLUSTER_ADVERTISE, NEXT = "127.0.0.16", "127.0.0.17", "127.0.0.18"
EDGE_A, OWN_EDGE, ROGUE = (f"{a}:7443" for a in (ADVERTISE, OWN_CLUSTER_ADVERTISE, NEXT))
# How long the agent waits at most between attempts (docs/node-protocol.md, "Block").
MAX_BACKOFF = 5.0
# The identity files a node never rewrites; node.json changes with the node's state.
IDENTITY_FILES = ("identity/node.key", "identity/node.crt", "identity/ca.crt")


def joined_agent(
    cli: CliRunner,
    files: ClusterFiles,
    env: dict[str, str],
    data_dir: Path,
    agents: list[AgentProcess],
    *,
    launcher: Path | None = None,
    edge: str = EDGE_A,
) -> tuple[AgentProcess, dict[str, Any]]:
    """An agent joined with a token through EDGE (by default the module's server's),
    connected; and its status."""
    agent = AgentProcess.joining(
        data_dir, [edge], files.ca_hash, token=create_token(cli, env), launcher=launcher
    ).start()
    agents.append(agent)
    return agent, agent.wait_status(connected, timeout=30)


def make_launcher(root: Path) -> Path:
    """A script that would start the agent; a purge must delete it, and only it."""
    bin_dir = root / "bin"
    bin_dir.mkdir()
    launcher = bin_dir / "start-oz0-node"
    launcher.write_text("#!/bin/sh\nexec oz0-node start --data-dir /var/lib/oz0-node\n")
    launcher.chmod(0o755)
    return launcher


def logged_at(agent: AgentProcess, line: str, *, count: int, timeout: float) -> list[float]:
    """When (seconds, by the log's clock) the agent logged LINE, once it has COUNT times."""
    deadline = time.monotonic() + timeout
    while True:
        found = [
            dt.datetime.strptime(logged[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            for logged in agent.log().splitlines()
            if logged.endswith(line)
        ]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} times only:\n{agent.log()}"
        time.sleep(0.2)


def node_json(data_dir: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((data_dir / "identity" / "node.json").read_text())
    return record


def audit_of(cli: CliRunner, node_id: str, env: dict[str, str]) -> list[dict[str, Any]]:
    """The node's audit entries, newest first."""
    found = cli("audit", "list", "--target", f"node:{node_id}", "--json", env=env)
    assert found.code == 0, found.err
    rows: list[dict[str, Any]] = found.json()
    return rows


def wait_audit(
    cli: CliRunner,
    node_id: str,
    env: dict[str, str],
    predicate: Callable[[list[dict[str, Any]]], bool],
    timeout: float,
) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        rows = audit_of(cli, node_id, env)
        if predicate(rows):
            return rows
        if time.monotonic() > deadline:
            raise AssertionError(f"audit never matched: {[r['action'] for r in rows]}")
        time.sleep(0.3)


def refusals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The node.purge.refused entries, oldest first."""
    return [r for r in reversed(rows) if r["action"] == "node.purge.refused"]


def context_at(files: ClusterFiles, api: str, root: Path) -> Path:
    """A copy of the admin context that names only the management API at API."""
    directory = root / f"context-{api}"
    shutil.copytree(files.context_dir, directory)
    context = Context.load(directory)
    replace(context, servers=(api,)).save()
    return context.path


def test_a_blocked_agent_keeps_its_files_and_is_back_within_10_s_of_the_unblock(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    agent, status = joined_agent(cli, cluster_files, cluster_env, data_dir, agents)
    node_id = status["node_id"]
    before, record_before = snapshot(data_dir, live=True), node_json(data_dir)

    blocked = cli("node", "block", node_id, "--reason", "lost laptop", env=cluster_env)
    assert blocked.code == 0, blocked.err
    began = time.monotonic()
    agent.wait_reported(
        lambda s: s.get("state") == "blocked" and s.get("connected") is False, timeout=5
    )
    took_to_block = time.monotonic() - began
    shown = agent.status()
    assert shown["state"] == "blocked" and shown["connected"] is False
    assert shown["running"] is True and shown["server"] is None

    # It keeps asking, refused each time, without anyone touching it: long enough for its
    # backoff to reach the cap (0.2 s doubled five times is over 5 s).
    refused = f"refused node {node_id}: node {node_id} is blocked; trying again"
    asked = logged_at(agent, refused, count=8, timeout=45)
    gaps = [later - earlier for earlier, later in itertools.pairwise(asked)]
    assert max(gaps) < MAX_BACKOFF + 0.5, f"asked again after {max(gaps):.2f} s"
    assert "lost laptop" not in agent.log(), "the reason is for the audit log only"

    after = snapshot(data_dir, live=True)
    assert after.keys() == before.keys()
    for name in IDENTITY_FILES:
        assert after[name] == before[name], name
    assert node_json(data_dir) == {**record_before, "state": "blocked"}

    began = time.monotonic()
    unblocked = cli("node", "unblock", node_id, env=cluster_env)
    assert unblocked.code == 0, unblocked.err
    back = agent.wait_reported(connected, timeout=15)
    took_to_return = time.monotonic() - began
    assert took_to_return < 10, f"back {took_to_return:.1f} s after the unblock"
    assert agent.running() and agent.process is not None
    assert back["pid"] == agent.process.pid, "the same agent process, not a restart"
    assert connected(agent.status())
    shown_by_server = cli("node", "show", node_id, "--json", env=cluster_env).json()
    assert shown_by_server["state"] == "accepted" and shown_by_server["connected"] is True
    assert snapshot(data_dir, live=True).keys() == before.keys()
    assert node_json(data_dir) == record_before
    actions = [(r["action"], r["details"]) for r in audit_of(cli, node_id, cluster_env)]
    assert actions[:2] == [
        ("node.unblock", {"now": "accepted"}),
        ("node.block", {"reason": "lost laptop", "was": "accepted"}),
    ]
    print(f"blocked after {took_to_block:.2f} s, back {took_to_return:.2f} s after unblock")


def test_a_purge_of_an_offline_agent_is_carried_out_when_it_comes_back(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    agent, status = joined_agent(cli, cluster_files, cluster_env, data_dir, agents)
    node_id = status["node_id"]
    agent.stop()
    launcher = make_launcher(tmp_path)

    purging = cli("node", "purge", node_id, "--yes", env=cluster_env)
    assert purging.code == 0, purging.err
    # (The module's other tests' nodes are listed too: this one once, purging.)
    listed = cli("node", "list", "--json", env=cluster_env).json()
    assert [(n["id"], n["state"]) for n in listed if n["id"] == node_id] == [(node_id, "purging")]
    assert data_dir.is_dir(), "nothing happens to an offline node's files yet"

    again = AgentProcess.resuming(data_dir, "--launcher", str(launcher)).start()
    agents.append(again)
    began = time.monotonic()
    assert again.wait_exit(timeout=30) == 0, again.log()
    took = time.monotonic() - began
    assert took < 15, f"exited {took:.1f} s after starting"
    assert not data_dir.exists()
    assert not launcher.exists() and launcher.parent.is_dir()
    assert f"node {node_id} purged: deleted {data_dir} and {launcher}" in again.log()

    shown = cli("node", "show", node_id, env=cluster_env)
    assert shown.code == 1 and "not found" in shown.err
    history = audit_of(cli, node_id, cluster_env)
    assert [r["action"] for r in history] == ["node.purged", "node.purge", "node.join"]
    assert history[0]["actor"] == {"kind": "node", "name": node_id}
    assert history[1]["actor"]["kind"] == "operator"
    print(f"purged and exited {took:.2f} s after starting")


@pytest.mark.slow
def test_a_connected_agent_purged_through_another_server_removes_itself(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    """A cluster of its own: it counts the cluster's servers, two."""
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    start_server(cluster_files, NEXT)
    data_dir = tmp_path / "node"
    launcher = make_launcher(tmp_path)
    agent, status = joined_agent(
        cli, cluster_files, cluster_env, data_dir, agents, launcher=launcher, edge=OWN_EDGE
    )
    node_id, streaming_to = status["node_id"], status["server"]
    servers = cli("cluster", "info", "--json", env=cluster_env).json()["servers"]
    assert len(servers) == 2
    (other,) = [server_address(s["advertise"]) for s in servers if s["id"] != streaming_to]
    through_other = {**cluster_env, "OZ0_CONTEXT": str(context_at(cluster_files, other, tmp_path))}

    purging = cli("node", "purge", node_id, "--yes", env=through_other)
    assert purging.code == 0, purging.err
    began = time.monotonic()
    assert agent.wait_exit(timeout=30) == 0, agent.log()
    took = time.monotonic() - began
    assert took < 10, f"exited {took:.1f} s after the purge"
    assert not data_dir.exists() and not launcher.exists()
    log = agent.log()
    # On its live stream: never refused, never reconnected, no second stream.
    assert log.count("control stream up") == 1, log
    assert "trying again" not in log and "reconnecting" not in log, log
    assert f"node {node_id} purged: deleted {data_dir} and {launcher}" in log

    assert cli("node", "show", node_id, env=cluster_env).code == 1
    history = audit_of(cli, node_id, cluster_env)
    assert [r["action"] for r in history] == ["node.purged", "node.purge", "node.join"]
    assert history[0]["actor"] == {"kind": "node", "name": node_id}
    assert history[0]["details"]["server"] == streaming_to
    print(f"purged through {other}, exited {took:.2f} s after the purge")


def test_a_purge_removes_symbolic_links_in_the_data_dir_and_never_what_they_point_to(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    agent, status = joined_agent(cli, cluster_files, cluster_env, data_dir, agents)
    node_id = status["node_id"]
    outside = tmp_path / "outside"
    (outside / "photos").mkdir(parents=True)
    (outside / "photos" / "holiday.jpg").write_bytes(b"precious")
    (outside / "notes.txt").write_text("also precious")
    kept = snapshot(outside)
    (data_dir / "link-to-dir").symlink_to(outside / "photos", target_is_directory=True)
    (data_dir / "nested").mkdir()
    (data_dir / "nested" / "link-to-file").symlink_to(outside / "notes.txt")
    (data_dir / "link-to-outside").symlink_to(outside, target_is_directory=True)

    purging = cli("node", "purge", node_id, "--yes", env=cluster_env)
    assert purging.code == 0, purging.err
    assert agent.wait_exit(timeout=30) == 0, agent.log()
    assert not data_dir.exists() and not data_dir.is_symlink()
    assert snapshot(outside) == kept
    assert (outside / "photos" / "holiday.jpg").read_bytes() == b"precious"
    assert (outside / "notes.txt").read_text() == "also precious"
    assert cli("node", "show", node_id, env=cluster_env).code == 1


def test_a_data_dir_that_names_another_node_is_never_deleted(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    """Say node.json was restored from another machine's backup while the agent was down:
    the directory names another node, while the agent still presents its own certificate."""
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    agent, status = joined_agent(cli, cluster_files, cluster_env, data_dir, agents)
    node_id = status["node_id"]
    agent.stop()
    other_node = name_another_node(data_dir)
    before = snapshot(data_dir)
    launcher = make_launcher(tmp_path)
    purging = cli("node", "purge", node_id, "--yes", env=cluster_env)
    assert purging.code == 0, purging.err

    again = AgentProcess.resuming(data_dir, "--launcher", str(launcher)).start()
    agents.append(again)
    # Refused, and refused again on its next stream, to a freshly signed command.
    rows = wait_audit(cli, node_id, cluster_env, lambda rows: len(refusals(rows)) >= 2, 20)
    assert again.running(), again.log()
    again.stop()

    refused = refusals(rows)
    assert refused[0]["details"]["nonce"] != refused[1]["details"]["nonce"]
    assert launcher.is_file()
    assert_refused_and_kept(cli, cluster_env, again, node_id, other_node, before)


def test_a_data_dir_whose_identity_changes_under_the_running_agent_is_never_deleted(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    """The same, with node.json replaced while the agent runs."""
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    agent, status = joined_agent(cli, cluster_files, cluster_env, data_dir, agents)
    node_id = status["node_id"]
    other_node = name_another_node(data_dir)
    before = snapshot(data_dir)
    purging = cli("node", "purge", node_id, "--yes", env=cluster_env)
    assert purging.code == 0, purging.err

    # Refused twice, or (refusing for good is as right) the agent stopped.
    wait_audit(
        cli,
        node_id,
        cluster_env,
        lambda rows: len(refusals(rows)) >= 2 or not agent.running(),
        20,
    )
    agent.stop()
    assert_refused_and_kept(cli, cluster_env, agent, node_id, other_node, before)


def name_another_node(data_dir: Path) -> str:
    """Make DIR's node.json name another node (its key and certificate stay); that node."""
    other_node = "node-" + secrets.token_hex(6)
    record = data_dir / "identity" / "node.json"
    record.write_text(json.dumps({**node_json(data_dir), "node_id": other_node}))
    return other_node


def assert_refused_and_kept(
    cli: CliRunner,
    env: dict[str, str],
    agent: AgentProcess,
    node_id: str,
    other_node: str,
    before: dict[str, str],
) -> None:
    """DIR is still there, naming OTHER_NODE; the agent's refusals are in the audit log."""
    data_dir = agent.data_dir
    assert data_dir.is_dir(), agent.log()
    after = snapshot(data_dir)
    for name in (*IDENTITY_FILES, "identity"):
        assert after[name] == before[name], name
    assert node_json(data_dir)["node_id"] == other_node
    history = audit_of(cli, node_id, env)
    assert "node.purged" not in [r["action"] for r in history]
    refused = refusals(history)
    assert refused, [r["action"] for r in history]
    log = agent.log()
    for entry in refused:
        assert entry["actor"] == {"kind": "node", "name": node_id}
        reason = entry["details"]["reason"]
        assert node_id in reason and other_node in reason, reason
        assert f"refused a purge command from edge {EDGE_A}: {reason}" in log
    shown = cli("node", "show", node_id, "--json", env=env).json()
    assert shown["state"] == "purging"


async def test_forged_purge_commands_from_a_rogue_edge_are_refused_and_not_audited(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    """The agent reaches the cluster only through a rogue edge that holds a real server
    certificate of the cluster but not the CA's key; every forged command it slips into
    the live stream is refused by the agent; the real server, which sent none of them,
    records none of the refusals."""
    cluster_files, cluster_env = served.files, served.files.cli_env
    data_dir = tmp_path / "node"
    rogue_ca = pki.new_ca("elsewhere", "cluster")
    async with rogue_edge.running(
        cluster_files,
        ROGUE,
        upstream=EDGE_A,
        node_dir=data_dir,
        offer_ca_pem=pki.cert_to_pem(rogue_ca.cert),
    ) as rogue:
        created = await cli_async(cli, "token", "create", "--tenant", "default", "--json",
                                  env=cluster_env)  # fmt: skip
        agent = AgentProcess.joining(
            data_dir, [ROGUE], cluster_files.ca_hash, token=created.json()["token"]
        ).start()
        agents.append(agent)
        with trio.fail_after(30):
            stream = await rogue.next_welcomed()
        assert stream.welcome is not None
        node_id, server_id = stream.welcome["node_id"], stream.welcome["server"]
        status = await trio.to_thread.run_sync(agent.wait_status, connected, 30)
        assert status["node_id"] == node_id and status["server"] == server_id
        assert node_json(data_dir)["edges"] == [ROGUE], "the agent knows only the rogue"
        before = snapshot(data_dir, live=True)

        # A genuine command for another node: node B, purged, its command captured.
        other = await pinned_keys(cluster_files, EDGE_A)
        other_token = await cli_async(cli, "token", "create", "--tenant", "default", "--json",
                                      env=cluster_env)  # fmt: skip
        joined = await edge_client.join(EDGE_A, other, token=other_token.json()["token"])
        assert joined["state"] == "accepted"
        purging = await cli_async(cli, "node", "purge", other.node_id, "--yes", env=cluster_env)
        assert purging.code == 0, purging.err
        async with edge_client.control(EDGE_A, other) as (_, for_other_node):
            assert for_other_node["type"] == "purge"
        # A genuine command for this node, as the edge signs it for another connection.
        loaded = await trio.to_thread.run_sync(rogue_edge.load_cluster, cluster_files)
        signed = purge_command.sign(
            loaded.cluster_ca,
            cluster=cluster_files.name,
            node_id=node_id,
            challenge=secrets.token_bytes(32),
        )
        forged = [
            (
                # with the very CA the rogue's hello offered instead of the cluster's
                rogue_edge.signed_purge(
                    rogue_ca.key,
                    cluster=cluster_files.name,
                    node_id=node_id,
                    challenge=stream.challenge,
                ),
                "signature does not verify with the cluster CA",
            ),
            (
                rogue_edge.signed_purge(
                    rogue_ca.key, cluster="elsewhere", node_id=node_id, challenge=stream.challenge
                ),
                "signature does not verify with the cluster CA",
            ),
            (for_other_node, f"command names node {other.node_id}, this is node {node_id}"),
            (
                {"type": "purge", "command": signed.command, "signature": signed.signature},
                "command was signed for another connection",
            ),
        ]
        nonces = []
        for message, reason in forged:
            nonce = rogue_edge.command_of(message)["nonce"]
            nonces.append(nonce)
            await stream.inject(message)
            with trio.fail_after(10):
                answer = await stream.from_node()
            assert answer == {"type": "purge_refused", "nonce": nonce, "reason": reason}

        # The real edge sent none of these commands: the refusals it relayed are the
        # node's business, not the audit log's (a node could send them in a loop). The
        # agent's log keeps each.
        await trio.sleep(1)
        rows = await trio.to_thread.run_sync(audit_of, cli, node_id, cluster_env)
        assert [r["action"] for r in rows] == ["node.join"]
        for _, reason in forged:
            assert f"refused a purge command from edge {ROGUE}: {reason}" in agent.log()

        # Still up on the same stream, still accepted, every file kept.
        assert not stream.ended.is_set() and len(rogue.relayed) == 3  # pin, join, control
        assert connected(await trio.to_thread.run_sync(agent.status))
        shown = (await cli_async(cli, "node", "show", node_id, "--json", env=cluster_env)).json()
        assert shown["state"] == "accepted" and shown["connected"] is True
        await trio.to_thread.run_sync(agent.stop)
    after = snapshot(data_dir)
    changed = {name for name in after.keys() | before.keys() if after.get(name) != before.get(name)}
    assert changed == {"status.json", "purge-nonces"}
    # Only commands the cluster CA signed count as seen.
    assert (data_dir / "purge-nonces").read_text().split() == nonces[2:]
