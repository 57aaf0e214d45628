"""Operators on Temporal (127.0.0.140, default ports), with a real server, real TLS and the
real `temporal` CLI: an operator certificate may only read, and only in its tenants'
namespaces (oz0/temporal/host/operatorapi.go); starting, signalling, terminating or
cancelling a workflow, or reading a workflow's history, is refused to every role, so work
reaches nodes only through the API, where it is authorized and audited. A removed operator,
or one moved to other tenants, is refused within two seconds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from functools import partial
from pathlib import Path
from typing import cast

import psycopg
import pytest
import trio

from fixtures.cluster import ClusterFiles, Served
from fixtures.polling import seconds_until
from fixtures.temporal import RecordingHost, server_credentials
from oz0 import context
from oz0.store.events import EventHub
from oz0.store.pool import open_database
from oz0.temporal import operator_access
from oz0.temporal.host_keeper import HostKeeper
from oz0.temporal.operator_access import OperatorAccessSync
from tests.conftest import CliRunner

ADVERTISE = "127.0.0.140"
FRONTEND = f"{ADVERTISE}:7233"
# The product's promise for a removal or a change of an operator's role or tenants.
BOUND = 2.0
REFUSED = "Request unauthorized"


def temporal(*args: str, creds: Path) -> subprocess.CompletedProcess[str]:
    """The real `temporal` CLI against the module's server, with the certificate in the
    context directory CREDS (ca.crt, operator.crt, operator.key)."""
    binary = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    return subprocess.run(
        [
            binary,
            *args,
            "--address",
            FRONTEND,
            "--tls-cert-path",
            str(creds / context.CERT_FILE),
            "--tls-key-path",
            str(creds / context.KEY_FILE),
            "--tls-ca-path",
            str(creds / context.CA_FILE),
            "--command-timeout",
            "10s",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


def works(answer: subprocess.CompletedProcess[str]) -> bool:
    assert answer.returncode == 0 or REFUSED in answer.stderr, answer.stderr
    return answer.returncode == 0


def refused(answer: subprocess.CompletedProcess[str]) -> bool:
    return not works(answer)


def sql(files: ClusterFiles, statement: str, *params: object) -> None:
    with psycopg.connect(files.main_db) as conn:
        conn.execute(statement, params)


def issued_person(
    cli: CliRunner, files: ClusterFiles, where: Path, name: str, role: str, tenants: list[str]
) -> Path:
    """A person NAME with ROLE in TENANTS, its context directory at WHERE/NAME: made as
    `server operator issue` makes one (a cluster-wide admin), then given its role."""
    directory = where / name
    issued = cli(
        "server", "operator", "issue", name, "--master-key-file", str(files.master_key),
        "--operator-dir", str(directory), "--advertise", ADVERTISE,
        env=files.cli_env,
    )  # fmt: skip
    assert issued.code == 0, issued.err
    sql(files, "UPDATE operators SET role = %s, tenants = %s WHERE name = %s", role, tenants, name)
    return directory


def as_server(files: ClusterFiles, where: Path) -> Path:
    """A context directory holding a server's certificate: Temporal's admin."""
    creds = server_credentials(files)
    directory = where / "server"
    directory.mkdir()
    (directory / context.CA_FILE).write_bytes(creds.ca_pem)
    (directory / context.CERT_FILE).write_bytes(creds.cert_pem)
    (directory / context.KEY_FILE).write_bytes(creds.key_pem)
    return directory


def tenant(cli: CliRunner, files: ClusterFiles, name: str) -> None:
    made = cli("tenant", "create", name, env=files.cli_env)
    assert made.code == 0 or "already exists" in made.err, made.err


def start_target(server: Path, namespace: str, workflow_id: str) -> None:
    """A workflow no worker runs (it stays running), started as a server; the namespace a
    tenant create just registered is usable once the frontend's cache has it."""
    seconds_until(
        lambda: temporal(
            "workflow", "start", "--namespace", namespace, "--type", "probe",
            "--task-queue", "probe", "--workflow-id", workflow_id, creds=server,
        ).returncode == 0,
        60,
        f"a workflow started in {namespace}",
        step=0.05,
    )  # fmt: skip


def status(server: Path, namespace: str, workflow_id: str) -> str:
    described = temporal(
        "workflow", "describe", "--namespace", namespace, "--workflow-id", workflow_id,
        "--output", "json", creds=server,
    )  # fmt: skip
    assert described.returncode == 0, described.stderr
    return str(json.loads(described.stdout)["workflowExecutionInfo"]["status"])


def writes(namespace: str, workflow_id: str) -> dict[str, tuple[str, ...]]:
    """Every way to act through Temporal the CLI has, on WORKFLOW_ID in NAMESPACE."""
    on = ("--namespace", namespace, "--workflow-id", workflow_id)
    return {
        "start": (
            "workflow", "start", "--namespace", namespace, "--type", "probe",
            "--task-queue", "probe", "--workflow-id", workflow_id + "-by-operator",
        ),
        "signal": ("workflow", "signal", *on, "--name", "anything"),
        "terminate": ("workflow", "terminate", *on, "--reason", "by an operator"),
        "cancel": ("workflow", "cancel", *on),
        "history": ("workflow", "show", *on),
        "namespace create": ("operator", "namespace", "create", "--namespace", "mine"),
        "namespace list": ("operator", "namespace", "list"),
    }  # fmt: skip


def test_an_operator_reads_only_in_its_tenants_namespaces_and_acts_nowhere(
    cli: CliRunner, served: Served, tmp_path: Path
) -> None:
    files = served.files
    tenant(cli, files, "acme")
    server = as_server(files, tmp_path)
    start_target(server, "acme", "acme-target")
    start_target(server, "default", "default-target")
    alice = issued_person(cli, files, tmp_path, "alice", "operator", ["acme"])
    # Made a cluster-wide admin, then an operator of acme: that reaches the host too.
    seconds_until(
        lambda: refused(temporal("workflow", "list", "--namespace", "default", creds=alice)),
        BOUND + 3,
        "alice refused in default",
        step=0.05,
    )

    listed = temporal("workflow", "list", "--namespace", "acme", creds=alice)
    assert listed.returncode == 0, listed.stderr
    assert "acme-target" in listed.stdout
    assert works(temporal("workflow", "count", "--namespace", "acme", creds=alice))
    assert works(
        temporal("workflow", "describe", "--namespace", "acme", "-w", "acme-target", creds=alice)
    )
    assert works(temporal("operator", "namespace", "describe", "--namespace", "acme", creds=alice))
    # What else docs/run-a-cluster.md says an operator may do.
    for args in (
        ("task-queue", "describe", "--namespace", "acme", "--task-queue", "probe"),
        ("operator", "search-attribute", "list", "--namespace", "acme"),
        ("operator", "cluster", "describe"),
    ):
        answer = temporal(*args, creds=alice)
        assert answer.returncode == 0, (args, answer.stderr)
    for namespace in ("default", "temporal-system"):
        assert refused(temporal("workflow", "list", "--namespace", namespace, creds=alice))
    assert refused(
        temporal("operator", "namespace", "describe", "--namespace", "default", creds=alice)
    )

    # Neither alice in her tenant nor the cluster-wide admin `server init` made may act.
    admin = files.context_dir
    assert works(temporal("workflow", "list", "--namespace", "default", creds=admin))
    assert works(temporal("workflow", "list", "--namespace", "acme", creds=admin))
    assert refused(temporal("workflow", "list", "--namespace", "temporal-system", creds=admin))
    for who, creds, namespace in (("alice", alice, "acme"), ("admin", admin, "default")):
        target = f"{namespace}-target"
        answers = {
            what: works(temporal(*args, creds=creds))
            for what, args in writes(namespace, target).items()
        }
        assert answers == dict.fromkeys(answers, False), f"{who} allowed: {answers}"
        # Nothing happened to the workflow they tried to signal, terminate and cancel.
        assert status(server, namespace, target) == "WORKFLOW_EXECUTION_STATUS_RUNNING"
    assert "operators may only read on Temporal" in served.server.stderr()
    assert "namespace is not one of the operator's tenants" in served.server.stderr()


def test_a_removed_operator_or_one_moved_to_other_tenants_is_refused_within_2_s(
    cli: CliRunner, served: Served, tmp_path: Path
) -> None:
    files = served.files
    tenant(cli, files, "beta")
    bob = issued_person(cli, files, tmp_path, "bob", "viewer", ["beta"])

    def lists(namespace: str) -> bool:
        return works(temporal("workflow", "list", "--namespace", namespace, creds=bob))

    seconds_until(
        lambda: lists("beta") and not lists("default"), BOUND + 3, "bob in beta only", step=0.05
    )

    sql(files, "UPDATE operators SET tenants = %s WHERE name = 'bob'", ["default"])
    moved = seconds_until(lambda: not lists("beta"), BOUND + 3, "bob refused in beta", step=0.05)
    assert lists("default")

    sql(files, "DELETE FROM operators WHERE name = 'bob'")
    removed = seconds_until(
        lambda: not lists("default"), BOUND + 3, "removed bob refused", step=0.05
    )
    print(f"on Temporal: moved refused in {moved:.2f} s, removed in {removed:.2f} s")
    assert moved < BOUND
    assert removed < BOUND


# --- pushing grants to the host (real PostgreSQL, no Temporal) ----------------------------


async def test_a_change_of_role_or_tenants_reaches_the_host_by_notification(
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
                serial = first["admin"]["serial"]
                # `server init`'s admin: cluster-wide.
                assert first == {"admin": {"serial": serial, "role": "admin", "tenants": []}}
                await nursery.start(sync.run)
                for pushes, (role, tenants) in enumerate(
                    (("viewer", []), ("viewer", ["beta", "acme"])), start=1
                ):
                    await trio.to_thread.run_sync(
                        partial(
                            sql,
                            cluster_files,
                            "UPDATE operators SET role = %s, tenants = %s WHERE name = 'admin'",
                            role,
                            tenants,
                        )
                    )
                    with trio.fail_after(BOUND):
                        await host.pushed_at_least(pushes)
                await trio.to_thread.run_sync(
                    lambda: sql(cluster_files, "DELETE FROM operators WHERE name = 'admin'")
                )
                with trio.fail_after(BOUND):
                    await host.pushed_at_least(3)
                assert host.pushed == [
                    {"admin": {"serial": serial, "role": "viewer", "tenants": []}},
                    {"admin": {"serial": serial, "role": "viewer", "tenants": ["acme", "beta"]}},
                    {},
                ]
                nursery.cancel_scope.cancel()
