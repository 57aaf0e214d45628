"""A node cannot see or touch another tenant's jobs (a real server on 127.0.0.193).

Two real agents, one in `default` and one in `acme`, run their own tenant's jobs only. A
third node of `acme`, scripted over the real protocol with its real certificate, tries
what a hostile node would: write output into the other tenant's running attempt through
its control stream, and read, signal or take the job workflows through Temporal.
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeWorkflowExecutionRequest,
    ListWorkflowExecutionsRequest,
    PollActivityTaskQueueRequest,
    PollWorkflowTaskQueueRequest,
    SignalWorkflowExecutionRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from fixtures import edge_client
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.job_calls import started_pid, wait_job
from fixtures.temporal import run_async
from oz0 import pki
from oz0_common.temporal_tls import tls_from_pems
from tests.conftest import CliRunner, create_token

SERVER = "127.0.0.193"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE, FRONTEND = f"{SERVER}:7443", f"{SERVER}:7233"
# A call Temporal lets through would long-poll for a minute: refused ones answer at once.
REFUSED_WITHIN = 5.0


def agent_in(
    cli: CliRunner, files: ClusterFiles, tmp_path: Path, tenant: str, agents: list[AgentProcess]
) -> str:
    agent = AgentProcess.joining(
        tmp_path / f"node-{tenant}",
        [EDGE],
        files.ca_hash,
        token=create_token(cli, files.cli_env, tenant=tenant),
    ).start()
    agents.append(agent)
    return str(agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)["node_id"])


async def stranger_writes_output(
    keys: edge_client.NodeKeys, chunks: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """The acks a scripted node gets for CHUNKS sent on its own control stream."""
    acks = []
    async with edge_client.control(EDGE, keys) as (ws, first):
        assert first["type"] == "welcome", first
        for chunk in chunks:
            await edge_client.send(ws, "job_output", **chunk)
            while (answer := await edge_client.receive(ws))["type"] != "job_output_ack":
                pass  # heartbeats
            acks.append(answer)
    return acks


async def refused(call: Callable[[], Awaitable[Any]]) -> bool:
    try:
        await asyncio.wait_for(call(), REFUSED_WITHIN)
    except RPCError as e:
        return e.status == RPCStatusCode.PERMISSION_DENIED
    except TimeoutError:
        return False  # let through: it was waiting for work
    return False


async def temporal_refusals(keys: edge_client.NodeKeys, job_id: str, other: str) -> dict[str, bool]:
    tls = tls_from_pems(keys.ca_pem, keys.cert_pem, pki.key_to_pem(keys.key))
    client = await Client.connect(FRONTEND, namespace="acme", tls=tls)
    service = client.workflow_service
    job = WorkflowExecution(workflow_id=job_id)
    calls: dict[str, Callable[[], Awaitable[Any]]] = {
        "describe the other tenant's job": lambda: service.describe_workflow_execution(
            DescribeWorkflowExecutionRequest(namespace="default", execution=job)
        ),
        "signal it as the sweeper would": lambda: service.signal_workflow_execution(
            SignalWorkflowExecutionRequest(
                namespace="default", workflow_execution=job, signal_name="node_removed"
            )
        ),
        "list its own tenant's jobs": lambda: service.list_workflow_executions(
            ListWorkflowExecutionsRequest(namespace="acme")
        ),
        "take job workflow tasks": lambda: service.poll_workflow_task_queue(
            PollWorkflowTaskQueueRequest(namespace="acme", task_queue=TaskQueue(name="oz0-jobs"))
        ),
        "take the servers' job steps": lambda: service.poll_activity_task_queue(
            PollActivityTaskQueueRequest(namespace="acme", task_queue=TaskQueue(name="oz0-jobs"))
        ),
        "take the other node's attempts": lambda: service.poll_activity_task_queue(
            PollActivityTaskQueueRequest(namespace="default", task_queue=TaskQueue(name=other))
        ),
    }
    return {name: await refused(call) for name, call in calls.items()}


@pytest.mark.slow
def test_a_node_cannot_see_or_touch_another_tenants_jobs(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    start_server(files, SERVER)
    assert cli("tenant", "create", "acme", env=env).code == 0
    ours = agent_in(cli, files, tmp_path, "default", agents)
    theirs = agent_in(cli, files, tmp_path, "acme", agents)

    running = cli(
        "job", "run", "--detach", "--json", "--", "sh", "-c", "echo pid $$; exec sleep 60",
        env=env,
    )  # fmt: skip
    job_id = running.json()["id"]
    started_pid(files, job_id, 1)
    everywhere = cli("job", "run", "--tenant", "acme", "--all", "--", "sh", "-c",
                     "echo $OZ0_NODE_ID", env=env)  # fmt: skip
    assert everywhere.code == 0, everywhere.err
    assert everywhere.out.split() == [theirs]  # acme's job, on acme's node only

    keys = edge_client.NodeKeys.new()
    keys.ca_pem, _ = trio.run(edge_client.fetch_ca, EDGE)
    joined = trio.run(
        lambda: edge_client.join(EDGE, keys, token=create_token(cli, files.cli_env, tenant="acme"))
    )
    assert joined["state"] == "accepted", joined
    forged = base64.b64encode(b"rm -rf / # from acme").decode()
    acks = trio.run(
        stranger_writes_output,
        keys,
        [
            {"job": job_id, "attempt": 1, "seq": 99, "stream": "stdout", "data": forged},
            {"job": job_id, "attempt": 2, "seq": 0, "stream": "stdout", "data": forged},
        ],
    )
    assert [(a["stored"], a["reason"]) for a in acks] == [(False, "ended"), (False, "ended")]
    with psycopg.connect(files.main_db) as conn:
        kept = conn.execute(
            "SELECT count(*) FROM job_output WHERE position('from acme' in"
            " convert_from(data, 'UTF8')) > 0"
        ).fetchone()
    assert kept == (0,)

    answers = run_async(lambda: temporal_refusals(keys, job_id, ours))
    assert answers == dict.fromkeys(answers, True), answers

    shown = wait_job(files, job_id, lambda j: j["state"] == "running", 5)
    assert [a["node"] for a in shown["attempts"]] == [ours]  # untouched by it all
    assert cli("job", "cancel", job_id, env=env).code == 0
