from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import TaskQueueKind, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    DescribeTaskQueueRequest,
    PollWorkflowTaskQueueRequest,
    ShutdownWorkerRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError

from fixtures.cluster import ClusterFiles, Served, StartServer, alive, wait_gone
from fixtures.polling import wait_until
from fixtures.temporal import (
    Credentials,
    access,
    connect,
    delete_node,
    describe_namespace,
    issue,
    new_node_id,
    operator_credentials,
    roundtrip,
    run_async,
    server_credentials,
    set_node,
)
from oz0 import pki
from oz0.jobs.workflow import JOBS_QUEUE
from tests.conftest import CliRunner

# The module's server (`served`), which the tests that only read or add share; those that
# kill a host or make a cluster of two have a cluster of their own (`cluster_files`) on
# OWN_CLUSTER_ADVERTISE, and the second server on .14.
ADVERTISE, OWN_CLUSTER_ADVERTISE, SECOND = "127.0.0.11", "127.0.0.13", "127.0.0.14"
A, OWN_A, OWN_B = (f"{a}:7233" for a in (ADVERTISE, OWN_CLUSTER_ADVERTISE, SECOND))


def count_workflows(address: str, namespace: str, creds: Credentials) -> int:
    async def work() -> int:
        client: Client = await connect(address, namespace, creds)
        return (await client.count_workflows()).count

    return run_async(work)


def refused(address: str, namespace: str, creds: Credentials) -> bool:
    return access(address, namespace, creds) == "denied"


def allowed(address: str, namespace: str, creds: Credentials) -> bool:
    return access(address, namespace, creds) == "allowed"


@pytest.mark.slow
def test_two_servers_form_one_temporal_cluster(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    start_server(cluster_files, SECOND)
    # A server's certificate: starting workflows and working on them is for servers only.
    creds = server_credentials(cluster_files)
    wait_until(
        lambda: allowed(OWN_A, "default", creds) and allowed(OWN_B, "default", creds),
        15,
        "a server allowed in default on both servers",
    )
    assert run_async(lambda: roundtrip(OWN_A, OWN_B, "default", creds)) == "HELLO!"


@pytest.mark.slow
def test_nodes_reach_only_their_tenants_namespace_and_only_while_accepted(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    assert cli("tenant", "create", "acme", env=cluster_env).code == 0
    acme_node, default_node, pending_node = new_node_id(), new_node_id(), new_node_id()
    acme = issue(cluster_files, pki.Role.NODE, acme_node)
    default = issue(cluster_files, pki.Role.NODE, default_node)
    set_node(cluster_files, acme_node, "acme", "accepted", acme)
    set_node(cluster_files, default_node, "default", "accepted", default)
    set_node(cluster_files, pending_node, "default", "pending")

    wait_until(lambda: allowed(A, "acme", acme), 15, "the acme node allowed in acme")
    assert refused(A, "default", acme)
    assert allowed(A, "default", default)
    assert refused(A, "acme", default)
    assert refused(A, "default", issue(cluster_files, pki.Role.NODE, pending_node))
    assert refused(A, "default", issue(cluster_files, pki.Role.NODE, new_node_id()))

    # A change of state reaches the host and is acknowledged: refused, then allowed again.
    for state in ("rejected", "blocked", "purging"):
        set_node(cluster_files, default_node, "default", state)
        wait_until(
            lambda: refused(A, "default", default),
            10,
            f"the default node refused in default ({state})",
        )
        set_node(cluster_files, default_node, "default", "accepted")
        wait_until(
            lambda: allowed(A, "default", default), 10, "the default node allowed in default again"
        )
    # A deleted node is unknown again.
    delete_node(cluster_files, default_node)
    wait_until(lambda: refused(A, "default", default), 10, "the deleted node refused")


def test_a_certificate_from_a_foreign_ca_fails_the_handshake(
    served: Served,
) -> None:
    cluster_files = served.files
    node = new_node_id()
    set_node(cluster_files, node, "default", "accepted")
    foreign = issue(cluster_files, pki.Role.NODE, node, ca=pki.new_ca("test", "cluster"))
    with pytest.raises(RuntimeError, match=r"[Cc]onnect"):
        count_workflows(A, "default", foreign)
    operator = operator_credentials(cluster_files)
    assert count_workflows(A, "default", operator) == 0


@pytest.mark.slow
def test_a_killed_host_is_restarted_and_serves_again(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    server = start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    (host,) = server.children()
    operator = operator_credentials(cluster_files)
    assert count_workflows(OWN_A, "default", operator) == 0

    def temporal_state() -> str:
        return str(
            cli("cluster", "info", "--json", env=cluster_env).json()["servers"][0]["temporal"]
        )

    os.kill(host, signal.SIGKILL)
    wait_until(lambda: temporal_state() == "restarting", 5, "Temporal restarting")
    wait_until(lambda: temporal_state() == "serving", 60, "Temporal serving again")
    (restarted,) = server.children()
    assert restarted != host
    assert count_workflows(OWN_A, "default", operator) == 0
    assert "Temporal host stopped (exit code -9); restarting in 1s" in server.stderr()


def test_the_host_dies_with_its_server_even_by_sigkill(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    server = start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    (host,) = server.children()
    assert alive(host)
    server.stop(signal.SIGKILL)
    wait_gone(host, timeout=30)
    assert not alive(host)


def test_the_host_does_not_read_its_own_executable_to_name_its_build(served: Served) -> None:
    # Temporal's SDK workers in the host (its worker service) are given a build ID
    # (buildid.go); without one, the first computes it as a digest of the whole executable,
    # read at every start (0.36 CPU-s of a start's 0.79 on this machine).
    (host,) = served.server.children()
    executable = Path(f"/proc/{host}/exe").readlink()
    counters = dict(line.split(": ") for line in Path(f"/proc/{host}/io").read_text().splitlines())
    read = int(counters["rchar"])  # what read() gave the process, from any file or socket
    assert read < executable.stat().st_size / 4, (read, executable)


def test_a_worker_s_poll_after_its_shutdown_does_not_keep_its_sticky_queue(
    served: Served,
) -> None:
    # A draining server's job worker calls ShutdownWorker (at the start of its shutdown,
    # while its polls may still be on the way). Matching unloads the worker's sticky queue,
    # but a poll that reached it afterwards loaded it again and counted as a poller for 10 s:
    # each next workflow task of that worker's workflows went there and waited out the
    # sticky timeout (10 s) instead of going to another server's worker at once
    # (test_graceful_stop). The host answers such a poll itself, with no task
    # (stickygone.go), and unloads the queue again a second later.
    creds = server_credentials(served.files)
    key = str(uuid.uuid4())
    sticky = TaskQueue(name=f"late-sticky-{key}", kind=TaskQueueKind.TASK_QUEUE_KIND_STICKY,
                       normal_name=JOBS_QUEUE)  # fmt: skip

    async def work() -> tuple[float, list[str]]:
        service = (await connect(A, "default", creds)).workflow_service
        await service.shutdown_worker(
            ShutdownWorkerRequest(
                namespace="default", sticky_task_queue=sticky.name, identity="late worker",
                reason="test", worker_instance_key=key, task_queue=JOBS_QUEUE,
                task_queue_types=[TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW],
            )
        )  # fmt: skip
        began = time.monotonic()
        with contextlib.suppress(RPCError):  # the deadline, when it waits as a live poll
            await service.poll_workflow_task_queue(
                PollWorkflowTaskQueueRequest(
                    namespace="default", task_queue=sticky, identity="late worker",
                    worker_instance_key=key,
                ),
                timeout=timedelta(seconds=3),
            )  # fmt: skip
        polled_for = time.monotonic() - began
        described = await service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace="default", task_queue=sticky,
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )  # fmt: skip
        return polled_for, [poller.identity for poller in described.pollers]

    polled_for, pollers = run_async(work)
    assert pollers == []
    assert polled_for < 2.5, polled_for


def test_tenants_are_created_with_their_namespace_and_listed(
    cli: CliRunner, served: Served
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    # A name of its own: the module's other tests make tenants too.
    created = cli("tenant", "create", "globex", "--json", env=cluster_env)
    assert created.code == 0, created.err
    assert created.json()["name"] == "globex" and created.json()["namespace"] == "globex"
    names = [t["name"] for t in cli("tenant", "list", "--json", env=cluster_env).json()]
    assert {"globex", "default"} <= set(names) and names == sorted(names)

    assert describe_namespace(A, "globex", operator_credentials(cluster_files)) == "globex"

    rows = cli("audit", "list", "--action", "tenant.create", "--json", env=cluster_env).json()
    assert (rows[0]["actor"]["name"], rows[0]["target"]) == ("admin", "tenant:globex")

    again = cli("tenant", "create", "globex", env=cluster_env)
    assert (again.code, again.err) == (1, "error: tenant globex already exists\n")
    bad = cli("tenant", "create", "Not Valid", env=cluster_env)
    assert bad.code == 1 and bad.err.startswith("error: invalid tenant name 'Not Valid'")
    assert [t["name"] for t in cli("tenant", "list", "--json", env=cluster_env).json()] == names
