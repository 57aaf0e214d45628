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
from typing import Any

import pytest

from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, cli_command, run_cli, servers_of
from oz0.context import Context

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (sessions given UIDs)"),
]

HOLDER, OTHER = "127.0.0.26", "127.0.0.27"


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
# last heartbeat (oz0/server/session_sweeper.py); generous, as end-to-end bounds are
# (a loaded machine has lagged past 15 s).
ENDED_BOUND = 30.0
# A stopped (SIGSTOP) server's node ends its stream after three heartbeats (15 s): the
# stop must end before that, for the stream to be there when it goes on.
STOPPED_BOUND = 12.0


def only_other(files: ClusterFiles, where: Path) -> dict[str, str]:
    """A CLI environment whose context names only the second server."""
    shutil.copytree(files.context_dir, where)
    context = Context.load(where)
    dataclasses.replace(context, servers=(f"{OTHER}:8443",), learned=()).save()
    return {"OZ0_CONTEXT": str(where / "context.json")}


@pytest.fixture(scope="module")
def held(
    servers: tuple[ClusterFiles, list[ServerProcess]], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, dict[str, str]]]:
    """A node whose stream the first server holds, and a CLI environment naming only the
    second: for the tests that stop the first."""
    files, _ = servers
    root = tmp_path_factory.mktemp("held")
    made = run_cli(files.cli_env, "token", "create", "--tenant", "default", "--json")
    assert made.returncode == 0, made.stderr
    agent = AgentProcess.joining(
        root / "node", [f"{HOLDER}:7443"], files.ca_hash, token=json.loads(made.stdout)["token"]
    ).start()
    try:
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
        yield str(status["node_id"]), only_other(files, root / "other")
    finally:
        stop_all([agent])


def open_session(node: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    """`node exec NODE` of a command that sleeps, once it has printed; and its ID."""
    session = subprocess.Popen(
        cli_command("node", "exec", node, "--", "sh", "-c", "echo started; exec sleep 600"),
        env={**os.environ, **env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert session.stdout is not None
    assert session.stdout.readline().strip() == "started", session.stderr
    [live] = json.loads(run_cli(env, "session", "list", "--live", "--json").stdout)
    return session, str(live["id"])


def ended_row(env: dict[str, str], session_id: str, bound: float) -> tuple[dict[str, Any], float]:
    """The session's record once it says it ended, BOUND seconds from now at most (else
    as it is then), and how long that took."""
    began = time.monotonic()
    while True:
        shown = run_cli(env, "session", "show", session_id, "--json")
        assert shown.returncode == 0, shown.stderr
        row: dict[str, Any] = json.loads(shown.stdout)
        if row["ended_at"] is not None or time.monotonic() - began > bound:
            return row, time.monotonic() - began
        time.sleep(0.3)


def ends_of(env: dict[str, str], session_id: str) -> list[dict[str, Any]]:
    listed = run_cli(env, "audit", "list", "--action", "session.end", "--json")
    assert listed.returncode == 0, listed.stderr
    return [e for e in json.loads(listed.stdout) if e["target"] == session_id]


def other_id(env: dict[str, str]) -> str:
    known = json.loads(run_cli(env, "cluster", "info", "--json").stdout)["servers"]
    return str(next(s["id"] for s in known if s["advertise"] == OTHER))


def test_a_server_taken_for_stopped_ends_its_session_and_writes_no_second_end(
    servers: tuple[ClusterFiles, list[ServerProcess]], held: tuple[str, dict[str, str]]
) -> None:
    """Frozen (SIGSTOP) past the up window, the first is taken for stopped: the second ends
    its session in the records; the first, going on, ends the session itself (it has
    written no heartbeat) and does not end it a second time."""
    _, [holder, _] = servers
    node, asked = held
    session, session_id = open_session(node, asked)
    try:
        os.kill(holder.pid, signal.SIGSTOP)
        try:
            row, took = ended_row(asked, session_id, STOPPED_BOUND)
        finally:
            os.kill(holder.pid, signal.SIGCONT)
        _, err = session.communicate(timeout=30)
    finally:
        if session.poll() is None:
            session.kill()
            session.communicate()
    assert row["ended_at"] is not None, f"not ended {took:.1f} s after its server stopped"
    assert row["why"] == "its server stopped"
    assert session.returncode == 1
    assert "error: the session ended: its server wrote no heartbeat for" in err, err
    # The first, on again, says it found the session ended already, and writes nothing.
    deadline = time.monotonic() + 10
    while "was ended in the records by another server" not in holder.stderr():
        assert time.monotonic() < deadline, holder.stderr()[-2000:]
        time.sleep(0.2)
    [end] = ends_of(asked, session_id)
    assert end["actor"] == {"kind": "server", "name": other_id(asked)}
    after = json.loads(run_cli(asked, "session", "show", session_id, "--json").stdout)
    assert (after["why"], after["ended_at"]) == ("its server stopped", row["ended_at"])


def test_a_killed_server_s_session_is_ended_in_the_records_by_another(
    servers: tuple[ClusterFiles, list[ServerProcess]], held: tuple[str, dict[str, str]]
) -> None:
    """Last in this file: it kills the first server."""
    _, [holder, _] = servers
    node, asked = held
    session, session_id = open_session(node, asked)
    try:
        holder.stop(signal.SIGKILL)
        row, took = ended_row(asked, session_id, ENDED_BOUND)
    finally:
        session.kill()
        session.communicate()
    assert row["ended_at"] is not None, f"not ended {took:.1f} s after its server was killed"
    assert (row["live"], row["exit_code"], row["why"]) == (False, None, "its server stopped")
    [end] = ends_of(asked, session_id)
    assert end["actor"] == {"kind": "server", "name": other_id(asked)}
    assert end["details"]["why"] == "its server stopped"
    assert end["details"]["output_bytes"] == row["output_bytes"] > 0
    assert run_cli(asked, "session", "list", "--live", "--json").stdout.strip() == "[]"
    # What it showed was in PostgreSQL before it was shown: it plays.
    played = run_cli(asked, "session", "play", session_id, "--speed", "1000")
    assert played.returncode == 0, played.stderr
    assert "started" in played.stdout
    print(f"ended in the records {took:.1f} s after its server was killed")
