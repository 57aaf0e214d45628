"""A streamed part through the crash points of its way (oz0/jobs/parts.py), with kill -9 on
real servers, real agents, real Temporal (127.0.0.42 and .43): each time the command runs
once, the job ends as it should, with all of its output.

Each crash is made from outside, with signals, at the point named: a server frozen
(SIGSTOP) holds what it has not done yet, then is killed (SIGKILL), and the node goes on
with the other server.
- the part's row written, not sent: the node's server frozen as the job is placed (by the
  other server), then killed: the other sends it when the node's next stream comes up;
- sent, not answered: the agent frozen, the part sent to it, its server killed, the agent
  thawed: sent again on its next stream, answered `runs` (or started once, never twice);
- the node's agent killed (-9) once it answered `started`: the command runs on under its
  supervisor, the next agent carries on;
- the end reported to a server that had not written it: the server frozen before the
  command ends, killed after: the node reports it again to the other.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fixtures.agent import AgentProcess
from fixtures.attempt_processes import all_gone
from fixtures.cluster import ClusterFiles, ServerProcess, StartServer
from fixtures.job_calls import output_of, started_pid, wait_job
from fixtures.polling import wait_until
from tests.conftest import CliRunner

A, B = "127.0.0.42", "127.0.0.43"
ADVERTISE = A
# Generous bounds for a loaded 2-core machine; deadlines, never measurements.
JOB_BOUND = 90.0


def two_servers(
    cli: CliRunner,
    files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> tuple[dict[str, ServerProcess], str, AgentProcess]:
    """Servers A and B; one agent that joined through A and streams to A; the CLI on B."""
    servers = {A: start_server(files, A), B: start_server(files, B)}
    created = cli(
        "token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=files.cli_env
    )
    assert created.code == 0, created.err
    agent = AgentProcess.joining(
        tmp_path / "node", [f"{A}:7443"], files.ca_hash, token=created.json()["token"]
    ).start()
    agents.append(agent)
    node = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)["node_id"]
    assert agent.status()["server"] is not None
    agent.wait_knows(f"{A}:7443", f"{B}:7443")
    use_only(files, B)
    wait_until(lambda: takes_stream(files, node), 20, "the node says it takes the stream", step=0.1)
    return servers, str(node), agent


def use_only(files: ClusterFiles, address: str) -> None:
    context = json.loads(files.context_path.read_text())
    context["servers"] = [f"{address}:8443"]
    files.context_path.write_text(json.dumps(context))


def db(files: ClusterFiles) -> psycopg.Connection[Any]:
    return psycopg.connect(files.main_db, autocommit=True)


def takes_stream(files: ClusterFiles, node: str) -> bool:
    with db(files) as conn:
        row = conn.execute("SELECT attempts_by_stream FROM nodes WHERE id = %s", (node,))
        found = row.fetchone()
    return bool(found and found[0])


def streamed_rows(files: ClusterFiles, job_id: str) -> list[tuple[int, str]]:
    with db(files) as conn:
        rows = conn.execute(
            "SELECT number, state FROM job_attempts WHERE job_id = %s AND streamed ORDER BY number",
            (job_id,),
        ).fetchall()
    return [(int(r[0]), str(r[1])) for r in rows]


def detached(cli: CliRunner, files: ClusterFiles, *command: str) -> str:
    run = cli("job", "run", "--detach", "--json", "--", *command, env=files.cli_env)
    assert run.code == 0, run.err
    return str(run.json()["id"])


def ran_once(files: ClusterFiles, job_id: str, node: str, stdout: str) -> None:
    done = wait_job(files, job_id, lambda j: j["ended_at"] is not None, JOB_BOUND)
    assert done["state"] == "succeeded", done
    assert [(a["node"], a["ended_because"]) for a in done["attempts"]] == [(node, "exit")], done
    out = b"".join(data for _, stream, data in output_of(files, job_id) if stream == "stdout")
    assert out.decode() == stdout, "the command ran once, all of its output kept once"


@pytest.mark.slow
def test_a_part_written_but_not_sent_when_its_nodes_server_dies_is_sent_by_the_next(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = cluster_files
    servers, node, agent = two_servers(cli, files, start_server, tmp_path, agents)
    servers[A].process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        job_id = detached(cli, files, "sh", "-c", "echo ran")
        wait_until(
            lambda: streamed_rows(files, job_id) == [(1, "running")], 20, "part written", step=0.1
        )
        time.sleep(1.0)
        assert output_of(files, job_id) == [], "nothing ran while its server was frozen"
    finally:
        servers[A].stop(signal.SIGKILL)
    ran_once(files, job_id, node, "ran\n")
    assert agent.log().count(f"job {job_id} attempt 1: handed") == 1


@pytest.mark.slow
def test_a_part_sent_but_not_answered_when_its_server_dies_runs_once(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = cluster_files
    servers, node, agent = two_servers(cli, files, start_server, tmp_path, agents)
    assert agent.process is not None
    agent.process.send_signal(signal.SIGSTOP)
    try:
        job_id = detached(cli, files, "sh", "-c", "echo pid $$")
        wait_until(
            lambda: streamed_rows(files, job_id) == [(1, "running")], 20, "part written", step=0.1
        )
        time.sleep(1.0)  # A's edge sent it; the frozen agent has not answered
        servers[A].stop(signal.SIGKILL)
    finally:
        agent.process.send_signal(signal.SIGCONT)
    pid = started_pid(files, job_id, 1, timeout=JOB_BOUND)
    ran_once(files, job_id, node, f"pid {pid}\n")
    assert agent.log().count(f"job {job_id} attempt 1: handed") == 1, "started once"


@pytest.mark.slow
def test_an_agent_killed_once_it_answered_started_leaves_the_command_to_the_next(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = cluster_files
    _servers, node, agent = two_servers(cli, files, start_server, tmp_path, agents)
    job_id = detached(cli, files, "sh", "-c", "sleep 2; echo pid $$")
    wait_until(lambda: f"job {job_id} attempt 1: handed" in agent.log(), 30, "started", step=0.1)
    assert agent.process is not None
    agent.process.send_signal(signal.SIGKILL)
    agent.process.wait(10)
    again = AgentProcess.resuming(agent.data_dir).start()
    agents.append(again)
    pid = started_pid(files, job_id, 1, timeout=JOB_BOUND)
    ran_once(files, job_id, node, f"pid {pid}\n")
    assert f"re-attached job {job_id} attempt 1" in again.log()
    # One log for both agents (the same data directory): handed over once, by the first.
    assert again.log().count(f"job {job_id} attempt 1: handed") == 1, "not started again"


@pytest.mark.slow
def test_an_end_its_server_never_wrote_is_reported_again_to_the_next(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files = cluster_files
    servers, node, _agent = two_servers(cli, files, start_server, tmp_path, agents)
    # Nothing printed after the pid: once the command ends, only its end is left to send.
    job_id = detached(cli, files, "sh", "-c", "echo pid $$; sleep 2")
    pid = started_pid(files, job_id, 1)
    servers[A].process.send_signal(signal.SIGSTOP)  # type: ignore[union-attr]
    try:
        all_gone([pid], 20, "the command ended")
        time.sleep(1.5)  # its end went to the frozen server
        assert streamed_rows(files, job_id) == [(1, "running")], "the end is not written yet"
    finally:
        servers[A].stop(signal.SIGKILL)
    ran_once(files, job_id, node, f"pid {pid}\n")
