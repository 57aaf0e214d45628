"""The node's runtime with a real agent and a real server (127.0.0.61, default ports).

A workflow of the test's own (with a server's certificate: an operator may only read on
Temporal), run by the test's own worker on a queue of its own, calls the agent's built-in
activity `oz0.node.describe` on the node's queue (its node ID): the node answers while
accepted, its runtime stops within 2 s of a block (nothing on its queue runs then), and it
works again within 10 s of the unblock.
"""

from __future__ import annotations

import datetime as dt
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.temporal import Credentials, run_async, server_credentials
from oz0_node import runtime
from tests.conftest import CliRunner

SERVER = "127.0.0.61"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE, TEMPORAL = f"{SERVER}:7443", f"{SERVER}:7233"
# The product's promises: a block within two seconds, an unblock noticed within ten.
BLOCK_BOUND, UNBLOCK_BOUND = 2.0, 10.0
# How long a call to a blocked node waits for a worker to take it, to show that none does.
UNANSWERED = dt.timedelta(seconds=5)
# The runtime's stop (runtime.STOP_TIMEOUT) and a margin for the process's exit.
EXIT_BOUND = runtime.STOP_TIMEOUT + 3.0


@workflow.defn(name="test.describe-node")
class DescribeNode:
    """Call `oz0.node.describe` on a node's queue; None when no worker took it in time."""

    @workflow.run
    async def run(self, node_queue: str, wait_for_worker: float) -> dict[str, Any] | None:
        try:
            result: dict[str, Any] = await workflow.execute_activity(
                "oz0.node.describe",
                task_queue=node_queue,
                schedule_to_start_timeout=dt.timedelta(seconds=wait_for_worker),
                start_to_close_timeout=dt.timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as e:
            cause = e.cause
            if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
                return None
            raise
        return result


async def describe_node(creds: Credentials, node_id: str, wait_for_worker: float) -> Any:
    client = await Client.connect(TEMPORAL, namespace="default", tls=creds.tls())
    queue = "probe-" + uuid.uuid4().hex[:8]
    async with Worker(
        client,
        task_queue=queue,
        workflows=[DescribeNode],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        return await client.execute_workflow(
            DescribeNode.run,
            args=[node_id, wait_for_worker],
            id="describe-" + uuid.uuid4().hex[:8],
            task_queue=queue,
            execution_timeout=dt.timedelta(seconds=wait_for_worker + 30),
        )


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError(f"no VmRSS for {pid}")


@pytest.mark.slow
def test_the_node_runtime_works_while_accepted_stops_on_block_and_returns_on_unblock(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    start_server(cluster_files, SERVER)
    created = cli("token", "create", "--tenant", "default", "--json", env=cluster_env)
    assert created.code == 0, created.err
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE], cluster_files.ca_hash, token=created.json()["token"]
    ).start()
    agents.append(agent)
    status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=30)
    node_id = status["node_id"]
    assert status["connected"] is True and status["state"] == "accepted"
    harness = server_credentials(cluster_files)

    described = run_async(lambda: describe_node(harness, node_id, 10))
    assert described is not None, agent.log()
    assert described["node_id"] == node_id
    assert described["agent_version"] and described["hostname"] and described["platform"]
    assert agent.process is not None
    rss_running = rss_kib(agent.process.pid)

    blocked = cli("node", "block", node_id, "--reason", "runtime test", env=cluster_env)
    assert blocked.code == 0, blocked.err
    began = time.monotonic()
    agent.wait_reported(lambda s: s.get("runtime") == "stopped", timeout=BLOCK_BOUND + 3)
    runtime_stopped = time.monotonic() - began
    shown = agent.status()
    assert shown["state"] == "blocked" and shown["runtime"] == "stopped"
    # Nothing on the node's queue runs while it is blocked.
    assert run_async(lambda: describe_node(harness, node_id, UNANSWERED.total_seconds())) is None
    rss_blocked = rss_kib(agent.process.pid)

    unblocked = cli("node", "unblock", node_id, env=cluster_env)
    assert unblocked.code == 0, unblocked.err
    began = time.monotonic()
    again = run_async(lambda: describe_node(harness, node_id, UNBLOCK_BOUND + 5))
    working_again = time.monotonic() - began
    assert again is not None and again["node_id"] == node_id, agent.log()
    # The agent writes its report just after the runtime is back: read within moments.
    agent.wait_status(lambda s: s.get("runtime") == "running", timeout=5)
    assert agent.running() and agent.log().count("node runtime working on") == 2

    # SIGTERM while the worker holds a long poll: the runtime's stop is bounded.
    began = time.monotonic()
    agent.process.send_signal(signal.SIGTERM)
    assert agent.wait_exit(timeout=30) == 0, agent.log()
    exited = time.monotonic() - began

    print(
        f"block -> runtime stopped {runtime_stopped:.2f} s;"
        f" unblock -> activity ran again {working_again:.2f} s;"
        f" SIGTERM -> exited {exited:.2f} s;"
        f" agent RSS {rss_running} KiB running, {rss_blocked} KiB blocked"
    )
    assert runtime_stopped < BLOCK_BOUND
    assert working_again < UNBLOCK_BOUND
    assert exited < EXIT_BOUND
