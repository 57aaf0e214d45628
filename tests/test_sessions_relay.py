"""A session reaches its node whichever server the CLI asks first (docs/sessions.md, "How
it travels"): two servers (127.0.0.26, 127.0.0.27), a real agent whose stream is held by
the first; a CLI whose context names only the second is sent to the first (`elsewhere`)
and gets its command's output and exit code; the session is recorded by the server that
relayed it. Last, the first is killed (SIGKILL) during a session: the second ends it in
the records, once, and its recording plays."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, cli_command, servers_of
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
def servers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[ClusterFiles, list[ServerProcess]]]:
    with servers_of(tmp_path_factory.mktemp("relay"), (HOLDER, OTHER)) as both:
        yield both


@pytest.fixture(scope="module")
def two_servers(servers: tuple[ClusterFiles, list[ServerProcess]]) -> ClusterFiles:
    return servers[0]


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


# A killed server's sessions are ended within the up window (5 s) and a sweep (2 s) of its
# last heartbeat (oz0/server/session_sweeper.py); generous, as end-to-end bounds are.
ENDED_BOUND = 15.0


def only_other(files: ClusterFiles, where: Path) -> dict[str, str]:
    """A CLI environment whose context names only the second server."""
    shutil.copytree(files.context_dir, where)
    context = Context.load(where)
    dataclasses.replace(context, servers=(f"{OTHER}:8443",), learned=()).save()
    return {"OZ0_CONTEXT": str(where / "context.json")}


def test_a_killed_server_s_session_is_ended_in_the_records_by_another(
    servers: tuple[ClusterFiles, list[ServerProcess]], tmp_path: Path
) -> None:
    """Last in this file: it kills the first server."""
    files, [holder, _] = servers
    made = run_cli(files.cli_env, "token", "create", "--tenant", "default", "--json")
    assert made.returncode == 0, made.stderr
    agent = AgentProcess.joining(
        tmp_path / "node", [f"{HOLDER}:7443"], files.ca_hash,
        token=json.loads(made.stdout)["token"],
    ).start()  # fmt: skip
    asked = only_other(files, tmp_path / "other")
    try:
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    except BaseException:
        stop_all([agent])
        raise
    node = str(status["node_id"])
    session = subprocess.Popen(
        cli_command("node", "exec", node, "--", "sh", "-c", "echo started; exec sleep 600"),
        env={**os.environ, **asked, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert session.stdout is not None
        assert session.stdout.readline().strip() == "started", session.stderr
        [live] = json.loads(run_cli(asked, "session", "list", "--live", "--json").stdout)
        holder.stop(signal.SIGKILL)
        killed = time.monotonic()
        deadline = killed + ENDED_BOUND
        while True:
            shown = run_cli(asked, "session", "show", live["id"], "--json")
            assert shown.returncode == 0, shown.stderr
            row = json.loads(shown.stdout)
            if row["ended_at"] is not None or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        took = time.monotonic() - killed
    finally:
        session.kill()
        session.communicate()
        stop_all([agent])
    assert row["ended_at"] is not None, f"not ended {took:.1f} s after its server was killed"
    assert (row["live"], row["exit_code"], row["why"]) == (False, None, "its server stopped")
    listed = run_cli(asked, "audit", "list", "--action", "session.end", "--json")
    [end] = [e for e in json.loads(listed.stdout) if e["target"] == live["id"]]
    known = json.loads(run_cli(asked, "cluster", "info", "--json").stdout)["servers"]
    other = next(s["id"] for s in known if s["advertise"] == OTHER)
    assert end["actor"] == {"kind": "server", "name": other}
    assert end["details"]["why"] == "its server stopped"
    assert end["details"]["output_bytes"] == row["output_bytes"] > 0
    assert run_cli(asked, "session", "list", "--live", "--json").stdout.strip() == "[]"
    # What it showed was in PostgreSQL before it was shown: it plays.
    played = run_cli(asked, "session", "play", live["id"], "--speed", "1000")
    assert played.returncode == 0, played.stderr
    assert "started" in played.stdout
    print(f"ended in the records {took:.1f} s after its server was killed")
