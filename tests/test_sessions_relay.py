"""A session reaches its node whichever server the CLI asks first (docs/sessions.md, "How
it travels"): two servers (127.0.0.26, 127.0.0.27), a real agent whose stream is held by
the first; a CLI whose context names only the second is sent to the first (`elsewhere`)
and gets its command's output and exit code; the session is recorded by the server that
relayed it."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import REPO, ClusterFiles, cli_command, cluster_of
from oz0.context import Context

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sessions given UIDs)"),
]

HOLDER, OTHER = "127.0.0.26", "127.0.0.27"


def run_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cli_command(*args),
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture(scope="module")
def two_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterFiles]:
    with cluster_of(tmp_path_factory.mktemp("relay"), (HOLDER, OTHER)) as files:
        yield files


def test_a_session_asked_of_another_server_is_relayed_by_the_one_holding_the_node(
    two_servers: ClusterFiles, tmp_path: Path
) -> None:
    env = two_servers.cli_env
    made = run_cli(env, "token", "create", "--tenant", "default", "--json")
    assert made.returncode == 0, made.stderr
    agent = AgentProcess.joining(
        tmp_path / "node", [f"{HOLDER}:7443"], two_servers.ca_hash,
        token=json.loads(made.stdout)["token"],
    ).start()  # fmt: skip
    try:
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
        node = str(status["node_id"])
        # A context that names only the server that does not hold the node's stream.
        elsewhere = tmp_path / "elsewhere"
        shutil.copytree(two_servers.context_dir, elsewhere)
        context = Context.load(elsewhere)
        dataclasses.replace(context, servers=(f"{OTHER}:8443",), learned=()).save()
        asked = {"OZ0_CONTEXT": str(elsewhere / "context.json")}
        done = run_cli(asked, "node", "exec", node, "--", "sh", "-c", "echo relayed; exit 5")
        assert done.returncode == 5, done.stderr
        assert done.stdout.replace("\r\n", "\n") == "relayed\n"
        [session] = json.loads(run_cli(env, "session", "list", "--json").stdout)
        servers = json.loads(run_cli(env, "cluster", "info", "--json").stdout)["servers"]
        holder = next(s["id"] for s in servers if s["advertise"] == HOLDER)
        assert (session["server"], session["exit_code"]) == (holder, 5)
    finally:
        stop_all([agent])
