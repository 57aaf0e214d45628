"""Least privilege on Temporal (ADVERTISE, default ports; the renewals on
OWN_CLUSTER_ADVERTISE), with a real server, real TLS, the real `temporal` CLI and real SDK
workers: only an operator's current certificate is taken (and only to read:
tests/test_temporal_operators.py has what an operator may do); a node may do what an
activity worker on its own queue needs and nothing else, and only with its current
certificate (a renewed-away one is refused); tenant names cannot take Temporal's own
namespaces or namespaces we did not create.

The tests of nodes' and tenants' privileges share the module's server (`served`): each adds
nodes, queues and tenants of its own and looks only at those. The renewals have a cluster
and server of their own (`cluster_files`): an operator's renewal voids the certificate of
the context the others use, and a node's needs short node certificates from the server's
start."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar, cast

import psycopg
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from temporalio import activity, workflow
from temporalio.api.common.v1 import Payloads, WorkflowExecution
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import (
    GetWorkflowExecutionHistoryRequest,
    PollActivityTaskQueueRequest,
    RespondActivityTaskCompletedByIdRequest,
    RespondActivityTaskCompletedRequest,
)
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, TimeoutError, TimeoutType
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker
from trio_websocket import WebSocketConnection

from fixtures import edge_client
from fixtures.cli_runner import cli_async
from fixtures.cluster import ClusterFiles, Served, ServerProcess, StartServer
from fixtures.edge_client import NodeKeys
from fixtures.polling import trio_until, wait_until
from fixtures.temporal import (
    Credentials,
    RecordingHost,
    access,
    connect,
    issue,
    long_poll,
    new_node_id,
    node_credentials,
    run_async,
    server_credentials,
    set_node,
)
from oz0 import nodes, pki
from oz0.store.events import EventHub
from oz0.store.pool import Database, open_database
from oz0.temporal import node_access, operator_access
from oz0.temporal.host_keeper import HostKeeper
from oz0.temporal.node_access import NodeAccessSync
from oz0.temporal.operator_access import OperatorAccessSync
from tests.conftest import CliRunner

T = TypeVar("T")
ADVERTISE = "127.0.0.71"
FRONTEND = f"{ADVERTISE}:7233"
# Where the renewal tests' own clusters (tests/conftest.py's cluster_files) start a server.
OWN_CLUSTER_ADVERTISE = "127.0.0.73"
RENEWAL_EDGE, RENEWAL_FRONTEND = (f"{OWN_CLUSTER_ADVERTISE}:{port}" for port in (7443, 7233))
# The product's promise for a renewed-away operator certificate.
RENEWAL_BOUND = 2.0
UNAUTHORIZED = "Error: unable to describe namespace default: Request unauthorized.\n"
# How long work on a queue waits for a worker, to show that none takes it.
UNTAKEN = 5.0


def temporal_cli(
    *args: str, credentials: Path, ca: Path, frontend: str = FRONTEND
) -> subprocess.CompletedProcess[str]:
    """The real `temporal` CLI against FRONTEND, with CREDENTIALS/operator.{crt,key}."""
    temporal = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    return subprocess.run(
        [
            temporal,
            *args,
            "--address",
            frontend,
            "--tls-cert-path",
            str(credentials / "operator.crt"),
            "--tls-key-path",
            str(credentials / "operator.key"),
            "--tls-ca-path",
            str(ca),
            "--command-timeout",
            "10s",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


# --- operators -----------------------------------------------------------------------------


def test_after_operator_renew_only_the_new_certificate_reaches_temporal(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    tmp_path: Path,
) -> None:
    server = start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    ctx = cluster_files.context_dir
    old, stray = tmp_path / "old", tmp_path / "stray"
    old.mkdir()
    stray.mkdir()
    for name in ("operator.crt", "operator.key"):
        shutil.copy2(ctx / name, old / name)
    # Signed by the cluster CA for the operator's name, but not the certificate it holds.
    other = issue(cluster_files, pki.Role.OPERATOR, "admin")
    (stray / "operator.crt").write_bytes(other.cert_pem)
    (stray / "operator.key").write_bytes(other.key_pem)

    def namespaces(credentials: Path) -> subprocess.CompletedProcess[str]:
        return temporal_cli(
            "operator",
            "namespace",
            "describe",
            "--namespace",
            "default",
            credentials=credentials,
            ca=ctx / "ca.crt",
            frontend=RENEWAL_FRONTEND,
        )

    before = namespaces(old)
    assert before.returncode == 0 and "default" in before.stdout, before.stderr
    stray_answer = namespaces(stray)
    assert (stray_answer.returncode, stray_answer.stderr) == (1, UNAUTHORIZED)

    renewed = cli("operator", "renew", env=cluster_env)
    assert renewed.code == 0, renewed.err
    began = time.monotonic()
    while (refused := namespaces(old)).returncode == 0:
        assert time.monotonic() - began < RENEWAL_BOUND + 5, "the old certificate stays admin"
        time.sleep(0.1)
    refused_after = time.monotonic() - began
    assert refused.stderr == UNAUTHORIZED
    assert "operator certificate is not the operator's current one" in server.stderr()
    after = namespaces(ctx)
    assert after.returncode == 0 and "default" in after.stdout, after.stderr
    print(f"old operator certificate refused {refused_after:.2f} s after `operator renew`")
    assert refused_after < RENEWAL_BOUND


# --- nodes ---------------------------------------------------------------------------------

NODE_ACTIVITY = "test.node-echo"


@activity.defn(name=NODE_ACTIVITY)
async def node_echo(text: str) -> str:
    # Long enough for the worker's own heartbeat (every second here) to reach the server.
    for _ in range(5):
        activity.heartbeat("working")
        await asyncio.sleep(0.5)
    return f"{activity.info().task_queue}: {text}"


def node_runtime() -> Runtime:
    """The SDK as a node runs it, but reporting its worker every second instead of every
    minute, so that call is part of the run."""
    return Runtime(telemetry=TelemetryConfig(), worker_heartbeat_interval=dt.timedelta(seconds=1))


@workflow.defn(name="test.call-node")
class CallNode:
    """Call the node activity on QUEUE; None when no worker took it within WAIT seconds."""

    @workflow.run
    async def run(self, queue: str, text: str, wait: float) -> str | None:
        try:
            result: str = await workflow.execute_activity(
                NODE_ACTIVITY,
                text,
                task_queue=queue,
                schedule_to_start_timeout=dt.timedelta(seconds=wait),
                start_to_close_timeout=dt.timedelta(seconds=20),
                heartbeat_timeout=dt.timedelta(seconds=10),
                retry_policy=RetryPolicy(maximum_attempts=1),
            )
        except ActivityError as e:
            cause = e.cause
            if isinstance(cause, TimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START:
                return None
            raise
        return result


class Starter:
    """A server's client (Temporal's admin: an operator may only read there) with a
    workflow worker for CallNode on a queue of its own."""

    def __init__(self, credentials: Credentials) -> None:
        self.credentials = credentials
        self.queue = "control-" + uuid.uuid4().hex[:8]

    async def call_node(self, node_queue: str, text: str, wait: float) -> str | None:
        client = await connect(FRONTEND, "default", self.credentials)
        async with self.worker(client):
            result: str | None = await client.execute_workflow(
                CallNode.run,
                args=[node_queue, text, wait],
                id="call-" + uuid.uuid4().hex[:8],
                task_queue=self.queue,
                execution_timeout=dt.timedelta(seconds=wait + 30),
            )
        return result

    def worker(self, client: Any) -> Worker:
        return Worker(
            client,
            task_queue=self.queue,
            workflows=[CallNode],
            workflow_runner=UnsandboxedWorkflowRunner(),
        )


async def node_worker_runs(
    starter: Starter, node: Credentials, polls: str, work_on: str, wait: float
) -> str | None:
    """While an activity worker with NODE's certificate polls POLLS (activities only, as the
    node runtime), the starter calls the activity on WORK_ON: its result, or None."""
    client = await Client.connect(
        FRONTEND, namespace="default", tls=node.tls(), runtime=node_runtime()
    )
    async with Worker(client, task_queue=polls, activities=[node_echo]):
        return await starter.call_node(work_on, "hello", wait)


def refusals(server: ServerProcess, node_id: str) -> list[dict[str, Any]]:
    """The host's log lines for calls it refused NODE_ID (JSON, on the server's stderr)."""
    found = []
    for line in server.stderr().splitlines():
        if "call refused" in line and f"node:{node_id}" in line:
            refusal = json.loads(line[line.index("{") :])
            # Probes before the node table reached the host are not the worker's doing.
            if refusal["reason"] != "unknown node":
                found.append(refusal)
    return found


async def refused(call: Callable[[], Awaitable[Any]]) -> bool:
    """Whether Temporal refused CALL its permission (any other outcome: it was let through)."""
    try:
        await call()
    except RPCError as e:
        return e.status == RPCStatusCode.PERMISSION_DENIED
    return False


def accepted_nodes(files: ClusterFiles, count: int) -> list[tuple[str, Credentials]]:
    nodes = []
    for _ in range(count):
        node_id = new_node_id()
        creds = issue(files, pki.Role.NODE, node_id)
        set_node(files, node_id, "default", "accepted", creds)
        nodes.append((node_id, creds))
    for node_id, creds in nodes:  # the node table reaches the host within a second or so
        wait_until(partial(allowed_in_default, creds), 15, f"node {node_id} allowed in default")
    return nodes


def allowed_in_default(creds: Credentials) -> bool:
    return access(FRONTEND, "default", creds) == "allowed"


@pytest.mark.slow
def test_a_node_is_an_activity_worker_on_its_own_queue_and_nothing_more(served: Served) -> None:
    server = served.server
    (a_id, a), (b_id, _) = accepted_nodes(served.files, 2)
    starter = Starter(server_credentials(served.files))

    # A's activity worker on its own queue (its node ID) runs an activity end to end, and
    # nothing its SDK calls on the way (connect, describe, poll, heartbeat, report the
    # worker, complete, shut down) is refused.
    assert run_async(lambda: node_worker_runs(starter, a, a_id, a_id, 30)) == f"{a_id}: hello"
    assert refusals(server, a_id) == []

    # A worker with A's certificate on B's queue is refused its polls (and its reports and
    # shutdown for that queue): work meant for B is never handed to it.
    assert run_async(lambda: node_worker_runs(starter, a, b_id, b_id, UNTAKEN)) is None
    reasons = {(r["api"].rsplit("/", 1)[1], r["reason"]) for r in refusals(server, a_id)}
    assert ("PollActivityTaskQueue", "a node polls only its own task queue") in reasons
    assert {api for api, _ in reasons} <= {
        "PollActivityTaskQueue",
        "RecordWorkerHeartbeat",
        "ShutdownWorker",
    }

    async def forbidden() -> dict[str, bool]:
        client = await connect(FRONTEND, "default", a)
        service = client.workflow_service
        starter_client = await connect(FRONTEND, "default", starter.credentials)
        target = await starter_client.start_workflow(
            CallNode.run, args=[a_id, "x", 1.0], id="wf-" + uuid.uuid4().hex[:8], task_queue="q"
        )
        handle = client.get_workflow_handle(target.id)
        execution = WorkflowExecution(workflow_id=target.id, run_id=target.result_run_id or "")
        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "poll B's queue": lambda: service.poll_activity_task_queue(
                PollActivityTaskQueueRequest(namespace="default", task_queue=TaskQueue(name=b_id))
            ),
            "start": lambda: client.start_workflow(
                CallNode.run, args=[a_id, "x", 1.0], id="by-node", task_queue=a_id
            ),
            "list": lambda: client.list_workflows().fetch_next_page(),
            "count": lambda: client.count_workflows(),
            "describe": lambda: handle.describe(),
            "signal": lambda: handle.signal("anything"),
            "terminate": lambda: handle.terminate(),
            "history": lambda: service.get_workflow_execution_history(
                GetWorkflowExecutionHistoryRequest(namespace="default", execution=execution)
            ),
            "complete by ID": lambda: service.respond_activity_task_completed_by_id(
                RespondActivityTaskCompletedByIdRequest(
                    namespace="default", workflow_id=target.id, activity_id="1"
                )
            ),
        }
        return {name: await refused(call) for name, call in calls.items()}

    answers = run_async(forbidden)
    assert answers == dict.fromkeys(answers, True) and len(answers) == 9


@pytest.mark.slow
def test_a_node_may_answer_only_the_tasks_it_was_given(served: Served) -> None:
    (a_id, a), (_, b) = accepted_nodes(served.files, 2)
    starter = Starter(server_credentials(served.files))

    async def scenario() -> tuple[bool, str | None]:
        starter_client = await connect(FRONTEND, "default", starter.credentials)
        a_client = await connect(FRONTEND, "default", a)
        b_client = await connect(FRONTEND, "default", b)
        async with starter.worker(starter_client):
            handle = await starter_client.start_workflow(
                CallNode.run,
                args=[a_id, "by hand", 30.0],
                id="call-" + uuid.uuid4().hex[:8],
                task_queue=starter.queue,
            )
            # A's own poll hands it the task: only A may answer it.
            task = await a_client.workflow_service.poll_activity_task_queue(
                PollActivityTaskQueueRequest(
                    namespace="default", task_queue=TaskQueue(name=a_id), identity="a"
                ),
                timeout=dt.timedelta(seconds=30),
            )
            assert task.task_token, "no task handed to A"
            completion = RespondActivityTaskCompletedRequest(
                namespace="default",
                task_token=task.task_token,
                result=Payloads(payloads=await starter_client.data_converter.encode(["by a"])),
            )
            b_refused = await refused(
                lambda: b_client.workflow_service.respond_activity_task_completed(completion)
            )
            await a_client.workflow_service.respond_activity_task_completed(completion)
            result: str | None = await asyncio.wait_for(handle.result(), 30)
        return b_refused, result

    assert run_async(scenario) == (True, "by a")


# --- a node's renewed-away certificate ------------------------------------------------------

# Short node certificates (OZ0_NODE_CERT_VALIDITY): the edge renews from half (12 s), and the
# old certificate is still valid for as long again, so a refusal is the renewal's doing.
SHORT_VALIDITY = 24


async def next_news(ws: WebSocketConnection) -> dict[str, Any]:
    """The edge's next message that is not a heartbeat or an edge list."""
    while (message := await edge_client.receive(ws))["type"] in ("heartbeat", "edges"):
        pass
    return message


async def keep_alive(*streams: WebSocketConnection) -> None:
    """Heartbeats as an agent sends them, so the edge keeps the streams while we wait."""
    while True:
        await trio.sleep(2)
        for ws in streams:
            await edge_client.send(ws, "heartbeat")


@pytest.mark.slow
async def test_after_a_node_renewal_temporal_takes_only_the_new_certificate(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(pki.NODE_VALIDITY_ENV, str(SHORT_VALIDITY))
    server = start_server(cluster_files, OWN_CLUSTER_ADVERTISE)
    env = cluster_files.cli_env
    created = await cli_async(cli, "token", "create", "--tenant", "default", "--json", env=env)
    assert created.code == 0, created.err
    keys = NodeKeys.new()
    keys.ca_pem, _ = await edge_client.fetch_ca(RENEWAL_EDGE)
    joined = await edge_client.join(RENEWAL_EDGE, keys, token=created.json()["token"])
    assert joined["state"] == "accepted", joined
    node_id = keys.node_id
    old = node_credentials(keys.ca_pem, keys.cert_pem, keys.key)
    old_cert = pki.cert_from_pem(keys.cert_pem)

    async def on_temporal(creds: Credentials) -> str:
        return await trio.to_thread.run_sync(access, RENEWAL_FRONTEND, "default", creds)

    poll: dict[str, Any] = {}
    poll_ended = trio.Event()

    async def poll_own_queue(creds: Credentials) -> None:
        poll["how"] = await trio.to_thread.run_sync(
            run_async, lambda: long_poll(RENEWAL_FRONTEND, "default", creds, node_id)
        )
        poll["at"] = time.monotonic()
        poll_ended.set()

    with trio.fail_after(90):
        while (first := await on_temporal(old)) != "allowed":  # the join reaches the host
            assert first == "denied"
            await trio.sleep(0.2)
        # Two control streams with the certificate the node joined with: the node's own, and
        # one as whoever also holds that key would keep it open.
        async with (
            edge_client.control(RENEWAL_EDGE, keys) as (ws, welcome),
            edge_client.control(RENEWAL_EDGE, keys) as (other_ws, other_welcome),
            trio.open_nursery() as nursery,
        ):
            assert welcome["type"] == other_welcome["type"] == "welcome"
            renewable = pki.renewal_point(old_cert, pki.NODE_RENEW_EARLIEST)
            # Until the renewal: after it the edge ends both streams.
            async with trio.open_nursery() as until_renewal:
                until_renewal.start_soon(keep_alive, ws, other_ws)
                await trio.sleep(max(0.0, (renewable - pki.utcnow()).total_seconds() - 3))
                # A long poll of the old certificate on the node's own queue, in flight at
                # the renewal (Temporal holds it for a minute when there is no task).
                nursery.start_soon(poll_own_queue, old)
                await trio.sleep(max(0.0, (renewable - pki.utcnow()).total_seconds()) + 0.5)
                assert not poll_ended.is_set(), "the poll ended before the renewal"
                until_renewal.cancel_scope.cancel()

            new_key = pki.new_private_key()
            csr = pki.make_csr(new_key, node_id).public_bytes(serialization.Encoding.PEM)
            await edge_client.send(ws, "renew", csr=csr.decode())
            answer = await next_news(ws)
            renewed_at = time.monotonic()
            assert answer["type"] == "renewed", answer
            new = node_credentials(keys.ca_pem, str(answer["certificate"]).encode(), new_key)

            while (old_answer := await on_temporal(old)) != "denied":
                assert old_answer == "allowed"
                assert time.monotonic() - renewed_at < RENEWAL_BOUND + 5, "old certificate kept"
                await trio.sleep(0.1)
            refused_after = time.monotonic() - renewed_at
            # Refused for the renewal: the old certificate has not expired yet.
            assert pki.utcnow() < old_cert.not_valid_after_utc
            assert await on_temporal(new) == "allowed"
            # The refusal above may be of a call in flight when the renewal landed, which the
            # host cuts without a log line (authz.go, interceptor); one made now meets the
            # host's authorizer, which logs why.
            assert await on_temporal(old) == "denied"
            # The old certificate's poll in flight was cut, not left to run its minute
            # (Temporal answers a cut poll empty, or the host as denied).
            with trio.fail_after(RENEWAL_BOUND + 5):
                await poll_ended.wait()
            assert poll["how"] in ("denied", "empty")
            cut_after = poll["at"] - renewed_at
            # The other stream with the old certificate is ended too.
            with trio.fail_after(RENEWAL_BOUND + 5):
                ended = await next_news(other_ws)
            ended_after = time.monotonic() - renewed_at
            assert (ended["type"], ended["code"]) == ("refused", "unknown"), ended
            nursery.cancel_scope.cancel()
    # Why, in the server's log: the host's refusal is logged by the host and passed on by
    # the server's loop reading its stderr (oz0/temporal/host_keeper.py read_log), which may
    # come a moment after the refusal itself on a loaded machine.
    await trio_until(
        lambda: "node certificate is not the node's current one" in server.stderr(),
        10,
        "the host's refusal of the old certificate in the server's log",
    )
    print(
        f"after a node renewal: old certificate refused on Temporal in {refused_after:.2f} s, "
        f"its long poll cut in {cut_after:.2f} s, its other control stream ended in "
        f"{ended_after:.2f} s"
    )
    assert refused_after < RENEWAL_BOUND
    assert cut_after < RENEWAL_BOUND
    assert ended_after < RENEWAL_BOUND


# --- tenants -------------------------------------------------------------------------------


@pytest.mark.slow
def test_tenant_names_of_temporals_own_or_foreign_namespaces_are_refused(
    cli: CliRunner, served: Served, tmp_path: Path
) -> None:
    cluster_files, cluster_env = served.files, served.files.cli_env
    ctx = cluster_files.context_dir
    # Only a server may create a namespace on Temporal (an operator may only read there).
    server = tmp_path / "server"
    server.mkdir()
    harness = server_credentials(cluster_files)
    (server / "operator.crt").write_bytes(harness.cert_pem)
    (server / "operator.key").write_bytes(harness.key_pem)

    def tenants() -> list[str]:
        return [t["name"] for t in cli("tenant", "list", "--json", env=cluster_env).json()]

    def creations_audited() -> list[str]:
        rows = cli("audit", "list", "--action", "tenant.create", "--json", env=cluster_env)
        return [row["target"] for row in rows.json()]

    # The cluster is the module's: the refusals must leave its tenants and their audit as
    # they were before this test.
    tenants_before, audited_before = tenants(), creations_audited()
    for name in ("temporal-system", "temporal-visibility"):
        reserved = cli("tenant", "create", name, env=cluster_env)
        assert (reserved.code, reserved.out, reserved.err) == (
            1,
            "",
            f"error: tenant name '{name}' is reserved: names starting with 'temporal-' are"
            " Temporal's own namespaces\n",
        )

    # A namespace someone made with the `temporal` CLI is not ours to take.
    made = temporal_cli(
        "operator",
        "namespace",
        "create",
        "--namespace",
        "foreign",
        credentials=server,
        ca=ctx / "ca.crt",
    )
    assert made.returncode == 0, made.stderr
    taken = cli("tenant", "create", "foreign", env=cluster_env)
    assert (taken.code, taken.out, taken.err) == (
        1,
        "",
        "error: Temporal already has a namespace foreign that orchestrator-zero did not"
        " create; choose another tenant name\n",
    )
    assert tenants() == tenants_before
    assert creations_audited() == audited_before

    # A namespace we registered is ours again: a create retried after its tenant row was
    # never written goes through.
    assert cli("tenant", "create", "acme", env=cluster_env).code == 0
    with psycopg.connect(cluster_files.main_db) as conn:
        conn.execute("DELETE FROM audit_log WHERE target = 'tenant:acme'")
        conn.execute("DELETE FROM tenants WHERE name = 'acme'")
    again = cli("tenant", "create", "acme", env=cluster_env)
    assert again.code == 0, again.err
    assert tenants() == sorted([*tenants_before, "acme"])


# --- pushing operators' grants to the host (real PostgreSQL, no Temporal) ------------------


class FlakyDatabase(Database):
    """The real database, failing its next FAILURES transactions as an outage would."""

    def __init__(self, db: Database, failures: int) -> None:
        self.db, self.failures = db, failures

    async def transaction(self, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        if self.failures > 0:
            self.failures -= 1
            raise psycopg.OperationalError("connection refused (injected)")
        return await self.db.transaction(work)


def set_serial(files: ClusterFiles, serial: int) -> None:
    with psycopg.connect(files.main_db) as conn:
        conn.execute("UPDATE operators SET cert_serial = %s WHERE name = 'admin'", (serial,))


async def test_a_renewal_reaches_the_host_by_notification(
    cluster_files: ClusterFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The re-read backstop slowed to once a minute: only the NOTIFY can be in time.
    monkeypatch.setattr(operator_access, "RECONCILE_EVERY", 60.0)
    host = RecordingHost()
    with trio.fail_after(20):
        async with open_database(cluster_files.main_db) as db, trio.open_nursery() as nursery:
            hub = EventHub(cluster_files.main_db)
            sync = OperatorAccessSync(db, hub, cast(HostKeeper, host))
            with sync.subscribed():
                await nursery.start(hub.run_forever)
                first = await sync.full_table()
                assert list(first) == ["admin"]
                await nursery.start(sync.run)
                await trio.to_thread.run_sync(set_serial, cluster_files, 4242)
                with trio.fail_after(RENEWAL_BOUND):
                    await host.pushed_at_least(1)
                assert host.pushed == [
                    {"admin": {"serial": "4242", "role": "admin", "tenants": []}}
                ]
                nursery.cancel_scope.cancel()


async def test_operator_sync_survives_a_database_outage(
    cluster_files: ClusterFiles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger=operator_access.__name__)
    host = RecordingHost()
    with trio.fail_after(30):
        async with open_database(cluster_files.main_db) as real:
            db = FlakyDatabase(real, failures=3)
            sync = OperatorAccessSync(db, EventHub(cluster_files.main_db), cast(HostKeeper, host))
            for _ in range(3):
                assert await sync.sync_once() is False
            assert host.pushed == []
            assert await sync.sync_once() is True
            (pushed,) = host.pushed
            assert list(pushed) == ["admin"]
            # Nothing new: nothing pushed.
            assert await sync.sync_once() is True and len(host.pushed) == 1
    # One line for the outage, one for the recovery: not one per try.
    lines = [r for r in caplog.records if r.name == operator_access.__name__]
    assert [r.levelname for r in lines] == ["WARNING", "INFO"]
    assert "failed, retrying" in lines[0].getMessage()


# --- pushing nodes' keys to the host (real PostgreSQL, no Temporal) ------------------------


def write_node(files: ClusterFiles, sql: str, *params: object) -> None:
    with psycopg.connect(files.main_db) as conn:
        conn.execute(sql, params)


async def test_a_node_key_change_reaches_the_host_by_notification_and_last_seen_does_not(
    cluster_files: ClusterFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The revision re-read slowed to once a minute: only the NOTIFY can be in time.
    monkeypatch.setattr(node_access, "RECONCILE_EVERY", 60.0)
    accepted, pending = new_node_id(), new_node_id()
    creds = issue(cluster_files, pki.Role.NODE, accepted)
    set_node(cluster_files, accepted, "default", "accepted", creds)
    write_node(
        cluster_files,
        "INSERT INTO nodes (id, tenant, state, public_key_sha256) VALUES (%s, %s, %s, %s)",
        pending,
        "default",
        "pending",
        "ab" * 32,
    )
    host = RecordingHost("authz", "nodes")
    with trio.fail_after(20):
        async with open_database(cluster_files.main_db) as db, trio.open_nursery() as nursery:
            hub = EventHub(cluster_files.main_db)
            sync = NodeAccessSync(db, hub, cast(HostKeeper, host))
            with sync.subscribed():
                await nursery.start(hub.run_forever)
                first = await sync.full_table()
                key = credentials_key(creds)
                # The key of the certificate the row holds; none for a node never issued one.
                assert first == {
                    accepted: {"tenant": "default", "state": "accepted", "keySha256": key},
                    pending: {"tenant": "default", "state": "pending"},
                }
                await nursery.start(sync.run)

                # The edge's frequent writes are no news.
                await trio.to_thread.run_sync(
                    lambda: write_node(
                        cluster_files,
                        "UPDATE nodes SET last_seen = now(), server = 's1' WHERE id = %s",
                        accepted,
                    )
                )
                # A renewal: a new key and certificate in the row, as the edge stores them.
                renewed = issue(cluster_files, pki.Role.NODE, accepted)
                await trio.to_thread.run_sync(
                    lambda: write_node(
                        cluster_files,
                        "UPDATE nodes SET public_key_sha256 = %s, certificate = %s WHERE id = %s",
                        credentials_key(renewed),
                        renewed.cert_pem.decode(),
                        accepted,
                    )
                )
                with trio.fail_after(RENEWAL_BOUND):
                    await host.pushed_at_least(1)
                assert host.pushed == [
                    {
                        accepted: {
                            "tenant": "default",
                            "state": "accepted",
                            "keySha256": credentials_key(renewed),
                        }
                    }
                ]
                nursery.cancel_scope.cancel()


def credentials_key(creds: Credentials) -> str:
    key = pki.cert_from_pem(creds.cert_pem).public_key()
    assert isinstance(key, ec.EllipticCurvePublicKey)
    return nodes.public_key_sha256(key)
