"""Real agents against real servers: the module's one (each test's agents are its own),
and for the move from one server to another a cluster of two of the test's own."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from fixtures.agent import AgentProcess, connected
from fixtures.cluster import ClusterFiles, Served, StartServer
from tests.conftest import CliRunner, create_token

# The module's server (tests/conftest.py's `served`).
ADVERTISE = "127.0.0.11"
EDGE_A = f"{ADVERTISE}:7443"
# The two servers the move goes between, of a cluster of the test's own (`cluster_files`).
OWN_CLUSTER_ADVERTISE = MOVE_A = "127.0.0.13"
MOVE_B = "127.0.0.14"


def test_an_agent_joins_with_a_token_and_connects(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    token = create_token(cli, cluster_env, "--label", "role=laptops")
    # A label contradicting the token's: the agent prints the edge's one line and exits.
    claiming = AgentProcess.joining(
        tmp_path / "claiming",
        [EDGE_A],
        cluster_files.ca_hash,
        token=token,
        labels={"role": "db-prod"},
    ).start()
    agents.append(claiming)
    assert claiming.wait_exit(timeout=30) != 0
    assert "label role=db-prod contradicts the token's role=laptops" in claiming.log()
    assert not (tmp_path / "claiming" / "identity" / "node.crt").exists()

    agent = AgentProcess.joining(
        tmp_path / "node",
        [EDGE_A],
        cluster_files.ca_hash,
        token=token,
        labels={"os": "linux", "role": "laptops"},
    ).start()
    agents.append(agent)
    status = agent.wait_status(connected, timeout=30)
    assert set(status) >= {"node_id", "cluster", "state", "connected", "server"}
    # The command itself, as a process, says what the fixture's in-process read said.
    said = agent.command_status()
    assert {k: said[k] for k in ("node_id", "state", "connected", "server", "running")} == {
        k: status[k] for k in ("node_id", "state", "connected", "server", "running")
    }
    assert status["cluster"] == "test"
    identity = tmp_path / "node" / "identity"
    assert (identity / "node.key").stat().st_mode & 0o777 == 0o600
    node_json = json.loads((identity / "node.json").read_text())
    assert node_json["node_id"] == status["node_id"] and node_json["cluster"] == "test"
    shown = cli("node", "show", status["node_id"], "--json", env=cluster_env).json()
    assert shown["connected"] is True and shown["server"] == status["server"]
    assert shown["labels"] == {"os": "linux", "role": "laptops"}

    # Resumes from what the directory remembers, with no flags but --data-dir.
    agent.stop()
    again = AgentProcess(tmp_path / "node", ["start", "--data-dir", str(tmp_path / "node")]).start()
    agents.append(again)
    resumed = again.wait_status(connected, timeout=30)
    assert resumed["node_id"] == status["node_id"]


def test_a_pending_agent_picks_its_certificate_up_when_accepted(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    agent = AgentProcess.joining(tmp_path / "node", [EDGE_A], cluster_files.ca_hash).start()
    agents.append(agent)
    pending = agent.wait_status(lambda s: s.get("state") == "pending", timeout=30)
    node_id = pending["node_id"]
    assert not (tmp_path / "node" / "identity" / "node.crt").exists()
    assert cli("node", "accept", node_id, env=cluster_env).code == 0
    status = agent.wait_status(connected, timeout=15)
    assert status["node_id"] == node_id
    assert agent.process is not None and agent.process.poll() is None, "no restart"


def test_a_rejected_agent_exits_with_the_reason(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    agent = AgentProcess.joining(tmp_path / "node", [EDGE_A], cluster_files.ca_hash).start()
    agents.append(agent)
    node_id = agent.wait_status(lambda s: s.get("state") == "pending", timeout=30)["node_id"]
    assert cli("node", "reject", node_id, "--reason", "not ours", env=cluster_env).code == 0
    assert agent.wait_exit(timeout=40) != 0
    assert f"node {node_id} was rejected: not ours" in agent.log()


@pytest.mark.usefixtures("served")
def test_a_wrong_ca_hash_is_refused(agents: list[AgentProcess], tmp_path: Path) -> None:
    wrong = "sha256:" + "0" * 64
    agent = AgentProcess.joining(tmp_path / "node", [EDGE_A], wrong).start()
    agents.append(agent)
    assert agent.wait_exit(timeout=30) != 0
    assert "CA hash mismatch" in agent.log()
    assert not (tmp_path / "node" / "identity" / "node.crt").exists()


@pytest.mark.slow
def test_an_agent_learns_server_b_and_moves_there_when_a_stops(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    server_a = start_server(cluster_files, MOVE_A)
    start_server(cluster_files, MOVE_B)
    edge_a, edge_b = f"{MOVE_A}:7443", f"{MOVE_B}:7443"
    # Told only about A: it learns B from the edge.
    agent = AgentProcess.joining(
        tmp_path / "node", [edge_a], cluster_files.ca_hash, token=create_token(cli, cluster_env)
    ).start()
    agents.append(agent)
    on_a = agent.wait_status(connected, timeout=30)
    # A may not have seen B's first heartbeat when it welcomed the agent; then B comes in
    # an `edges` message (A reads the servers up every 2 s).
    assert edge_b in agent.wait_knows(edge_b)

    server_a.stop(signal.SIGTERM)
    on_b = agent.wait_status(lambda s: connected(s) and s["server"] != on_a["server"], timeout=30)
    info = cli(
        "cluster",
        "info",
        "--json",
        env={**cluster_env, "OZ0_CONTEXT": str(_context_for_b(cluster_files))},
    ).json()
    assert [s["id"] for s in info["servers"]] == [on_b["server"]]


def _context_for_b(files: ClusterFiles) -> Path:
    """The admin context, pointed at server B (A is gone)."""
    from dataclasses import replace

    from oz0.context import Context

    context = Context.load(files.context_path)
    replace(context, servers=(f"{MOVE_B}:8443",)).save()
    return files.context_path
