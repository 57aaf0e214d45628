"""SIGTERM drains a server (oz0/server/start.py): requests in flight are answered, new
connections refused, streamed nodes moved to another server at once, all within the grace.

A request is made slow without a fake: the test holds a lock on the table it writes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from fixtures.agent import AgentProcess, connected
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, StartServer, cli_command
from fixtures.job_calls import output_of, wait_job
from fixtures.polling import wait_until
from fixtures.temporal import run_async, server_credentials
from oz0.server.start import SHUTDOWN_GRACE
from tests.conftest import CliRunner

SERVER_A, SERVER_B = "127.0.0.237", "127.0.0.238"
ADVERTISE = SERVER_A  # the suite's cluster_files (tests/conftest.py)
EDGE_A, EDGE_B = f"{SERVER_A}:7443", f"{SERVER_B}:7443"
# After the grace, cutting what is left and stopping the roles; generous for a loaded
# machine (an idle server's stop alone once took 4.5 s there, tests/test_server.py).
CLEANUP_BOUND = 6.0
# From SIGTERM to the node's stream on the other server; a drain that did not tell it to
# move would cut its stream only at the grace, SHUTDOWN_GRACE (4 s) after the signal.
MOVE_BOUND = 3.0


@pytest.fixture
def tokens_locked(cluster_files: ClusterFiles) -> Iterator[psycopg.Connection[Any]]:
    """A transaction holding the join tokens' table: `token create` waits on it until the
    test commits (or the test ends)."""
    url = cluster_files.url
    with psycopg.connect(url.for_database(url.names.main)) as conn:
        conn.execute("LOCK TABLE join_tokens IN ACCESS EXCLUSIVE MODE")
        yield conn
        if not conn.closed:
            conn.rollback()


@pytest.fixture
def token_create(cluster_files: ClusterFiles) -> Iterator[Callable[[], subprocess.Popen[str]]]:
    """Starts `token create` in a process of its own, as an operator runs it; one still
    running when the test ends is killed and reaped (left to the garbage collector, it
    fails a later test with an unraisable ResourceWarning)."""
    started: list[subprocess.Popen[str]] = []

    def start() -> subprocess.Popen[str]:
        process = subprocess.Popen(
            cli_command("token", "create", "--tenant", "default", "--json"),
            env={**os.environ, **cluster_files.cli_env, "PYTHONPATH": str(REPO)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.communicate()


def _waits_on_the_lock(files: ClusterFiles) -> bool:
    url = files.url
    with psycopg.connect(url.for_database(url.names.main), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND query ILIKE '%join_tokens%'"
        ).fetchone()
    return row is not None and row[0] > 0


def _refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


def _draining(server: ServerProcess) -> bool:
    return "draining: " in server.stderr()


def _serving_a_waiting_request(
    files: ClusterFiles,
    start_server: StartServer,
    token_create: Callable[[], subprocess.Popen[str]],
) -> tuple[ServerProcess, subprocess.Popen[str]]:
    """Server A, and a `token create` in flight there, waiting on the tokens' lock."""
    server = start_server(files, SERVER_A)
    request = token_create()
    wait_until(lambda: _waits_on_the_lock(files), 15, "token create waits on the lock", step=0.05)
    return server, request


def test_a_request_in_flight_at_sigterm_is_answered_while_new_connections_are_refused(
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tokens_locked: psycopg.Connection[Any],
    token_create: Callable[[], subprocess.Popen[str]],
) -> None:
    server, request = _serving_a_waiting_request(cluster_files, start_server, token_create)

    server.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    wait_until(lambda: _draining(server), 3, "the server drains", step=0.05)
    # The drain's first line is logged as it begins; the listeners close just after it.
    wait_until(lambda: _refused(SERVER_A, 8443), 2, "new connections to the API refused")
    wait_until(lambda: _refused(SERVER_A, 7443), 2, "new connections to the edge refused")
    assert server.process is not None and server.process.poll() is None

    tokens_locked.commit()  # the request goes on, within the grace
    out, err = request.communicate(timeout=10)
    assert request.returncode == 0, err
    assert json.loads(out)["token"]
    assert server.wait(CLEANUP_BOUND + SHUTDOWN_GRACE) == 0
    assert "1 request(s) and 0 node stream(s) ended, 0 request(s) and 0 stream(s) cut" in (
        server.stderr()
    )


def test_a_request_that_never_ends_is_cut_at_the_grace_and_the_server_stops(
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tokens_locked: psycopg.Connection[Any],
    token_create: Callable[[], subprocess.Popen[str]],
) -> None:
    server, request = _serving_a_waiting_request(cluster_files, start_server, token_create)

    began = time.monotonic()
    server.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert server.wait(SHUTDOWN_GRACE + CLEANUP_BOUND) == 0
    took = time.monotonic() - began
    # It waited for the request, as long as the grace allows, and no longer.
    assert SHUTDOWN_GRACE - 0.5 <= took < SHUTDOWN_GRACE + CLEANUP_BOUND, took
    assert "0 request(s) and 0 node stream(s) ended, 1 request(s) and 0 stream(s) cut" in (
        server.stderr()
    )
    # The log names what held the stop: the management API alone.
    assert "the drain was cut after 4 s; still draining: management\n" in server.stderr()
    request.communicate(timeout=30)
    assert request.returncode != 0


def test_a_node_streaming_to_a_stopping_server_moves_to_the_other_at_once(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    server_a = start_server(cluster_files, SERVER_A)
    start_server(cluster_files, SERVER_B)
    created = cli("token", "create", "--tenant", "default", "--json", env=cluster_env)
    assert created.code == 0, created.err
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE_A], cluster_files.ca_hash, token=created.json()["token"]
    ).start()
    agents.append(agent)
    on_a = agent.wait_status(connected, timeout=30)
    agent.wait_knows(EDGE_B)

    began = time.monotonic()
    server_a.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    on_b = agent.wait_status(lambda s: connected(s) and s["server"] != on_a["server"], timeout=30)
    moved_in = time.monotonic() - began
    assert moved_in < MOVE_BOUND, f"moved to B {moved_in:.2f} s after A's SIGTERM"
    assert "asked node" in agent.log() and "moving to another edge now" in agent.log()
    assert server_a.wait(SHUTDOWN_GRACE + CLEANUP_BOUND) == 0
    assert "0 request(s) and 1 node stream(s) ended, 0 request(s) and 0 stream(s) cut" in (
        server_a.stderr()
    )
    assert on_b["node_id"] == on_a["node_id"]


def _workflow_task_timeouts(files: ClusterFiles, address: str, job_ids: list[str]) -> list[str]:
    """The jobs whose workflow histories have a workflow task that timed out (one a
    stopped worker took and never finished, or one left on its sticky queue)."""

    async def look() -> list[str]:
        client = await Client.connect(
            f"{address}:7233", namespace="default", tls=server_credentials(files).tls()
        )
        timed_out = []
        for job_id in job_ids:
            history = await client.get_workflow_handle(job_id).fetch_history()
            if any(
                e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT for e in history.events
            ):
                timed_out.append(job_id)
        return timed_out

    return run_async(look)


@pytest.mark.slow
def test_a_stopping_servers_job_workflows_go_on_at_once_on_the_other(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    """Jobs whose workflows only A's job worker has run so far (B starts later), their
    commands running while A is drained: A's worker finishes what it has and lets go of the
    workflows (its sticky queue), so B's worker takes each next step at once. A worker not
    shut down so (seen: `_shutdown` skipped) leaves each step to time out first (10 s)."""
    files = cluster_files
    server_a = start_server(files, SERVER_A)
    context = json.loads(files.context_path.read_text())
    context["servers"] = [f"{SERVER_A}:8443", f"{SERVER_B}:8443"]
    files.context_path.write_text(json.dumps(context))
    created = cli("token", "create", "--tenant", "default", "--json", env=files.cli_env)
    assert created.code == 0, created.err
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE_A], files.ca_hash, token=created.json()["token"]
    ).start()
    agents.append(agent)
    agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    seconds = 8
    job_ids = []
    for _ in range(3):
        run = cli("job", "run", "--detach", "--json", "--all", "--",
                  "sh", "-c", f"echo up; exec sleep {seconds}", env=files.cli_env)  # fmt: skip
        assert run.code == 0, run.err
        job_ids.append(run.json()["id"])

    wait_until(lambda: all(output_of(files, j) for j in job_ids), 30, "every command started",
               step=0.1)  # fmt: skip
    start_server(files, SERVER_B)
    agent.wait_knows(EDGE_B)
    server_a.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    assert server_a.wait(SHUTDOWN_GRACE + CLEANUP_BOUND) == 0
    assert "job worker(s) stopped" in server_a.stderr()

    for job_id in job_ids:
        job = wait_job(files, job_id, lambda j: j["ended_at"] is not None, 90)
        assert job["state"] == "succeeded" and len(job["attempts"]) == 1, job
    assert _workflow_task_timeouts(files, SERVER_B, job_ids) == []
