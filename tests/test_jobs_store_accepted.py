"""The jobs' rows on a real PostgreSQL: what `job run` accepts, with the reason for what it
refuses, and a job's limits kept with it and its attempts.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them
(fixtures/job_rows.py).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fixtures import job_rows
from fixtures.job_rows import add_node, new_job, place
from oz0.jobs import store
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.spec import JobError, JobSpec

CLEAN = job_rows.CLEAN


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "command must be a non-empty list"),
        ({"command": []}, "command must be a non-empty list"),
        ({"command": ["ls", 3]}, "every argument of the command must be text"),
        ({"command": ["a\0b"]}, "NUL"),
        ({"command": ["true"], "timeout": 0}, "timeout must be more than 0"),
        ({"command": ["true"], "timeout": True}, "timeout must be a number"),
        ({"command": ["true"], "retries": -1}, "retries must be a whole number"),
        ({"command": ["true"], "env": {"OZ0_JOB_ID": "x"}}, "are the agent's"),
        ({"command": ["true"], "env": {"1BAD": "x"}}, "invalid environment variable name"),
        ({"command": ["true"], "selector": {"Bad Key": "x"}}, "selector: invalid label key"),
        ({"command": ["true"], "node": "nope"}, "invalid node ID"),
        ({"command": ["true"], "all": True, "node": "node-0123456789ab"}, "either a node or all"),
        ({"command": ["true"], "colour": "red"}, "unknown field 'colour'"),
        ({"command": ["true"], "limits": []}, "limits must be an object"),
        ({"command": ["true"], "limits": {"disk": 1}}, "unknown limit 'disk'"),
        ({"command": ["true"], "limits": {"memory": "lots"}}, "limits.memory: invalid size"),
        ({"command": ["true"], "limits": {"memory": 1024}}, "at least 4 MiB"),
        ({"command": ["true"], "limits": {"memory": True}}, "limits.memory: invalid size"),
        ({"command": ["true"], "limits": {"address_space": "3M"}}, "at least 4 MiB"),
        ({"command": ["true"], "limits": {"cpu": 0}}, "limits.cpu: invalid cpu 0"),
        ({"command": ["true"], "limits": {"cpu": "half"}}, "limits.cpu: invalid cpu"),
        ({"command": ["true"], "limits": {"cpu": 2000}}, "from 0.01 to 1024"),
        ({"command": ["true"], "limits": {"max_processes": 0}}, "from 1 to"),
        ({"command": ["true"], "limits": {"max_processes": 1.5}}, "from 1 to"),
        ({"command": ["true"], "limits": {"max_open_files": 15}}, "from 16 to"),
    ],
)
def test_a_job_asked_for_wrongly_is_refused_with_the_reason(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(JobError, match=message):
        JobSpec.from_json(body)


def test_a_new_job_is_queued_audited_and_shows_env_names_only(
    conn: psycopg.Connection[Any],
) -> None:
    job = new_job(conn, command=["env"], env={"TOKEN": "s3cret"}, selector={"role": "web"})
    shown = job.to_json()
    assert shown["state"] == "queued" and shown["attempts"] == []
    assert shown["env"] == ["TOKEN"] and "s3cret" not in str(shown)
    row = conn.execute(
        "SELECT actor, action, details FROM audit_log WHERE target = %s", (f"job:{job.id}",)
    ).fetchone()
    assert row is not None and row[0] == "admin" and row[1] == "job.run"
    assert "s3cret" not in str(row[2]) and row[2]["selector"] == {"role": "web"}


def test_bad_limits_are_one_line_and_write_nothing(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(JobError) as caught:
        new_job(conn, limits={"memory": "2G", "max_open_files": 8})
    assert str(caught.value) == (
        "limits.max_open_files: max open files must be a whole number from 16 to 1048576, not 8"
    )
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)


def test_limits_are_kept_with_the_job_and_what_a_node_applied_with_its_attempt(
    conn: psycopg.Connection[Any],
) -> None:
    node = add_node(conn)
    job = new_job(conn, node=node, limits={"memory": "512M", "cpu": 0.5, "max_processes": 64})
    asked = {"memory": 512 << 20, "cpu": 0.5, "max_processes": 64}
    assert job.limits == asked and job.to_json()["limits"] == asked
    assert new_job(conn).limits == {} and new_job(conn, limits=None).limits == {}
    row = conn.execute(
        "SELECT details FROM audit_log WHERE target = %s", (f"job:{job.id}",)
    ).fetchone()
    assert row is not None and row[0]["limits"] == asked
    applied = {
        "user": "uid 61184 (its own)",
        "tracking": "cgroup v2",
        "limits": {"memory": "cgroup v1"},
        "private_tmp": "mount namespace",
        "swept": "ended 1 process, removed 2 files",
    }
    # A node is not trusted to keep to the shape: unknown keys go, text is cut and made
    # printable.
    hostile = {
        "user": "x\x1b[2J" + "y" * 500,
        "limits": {"memory": 7, "cpu": "rlimit", "disk": "z"},
        "extra": "dropped",
    }
    # The third: an older node that said nothing, or an attempt that ended without an answer.
    for number, said in ((1, applied), (2, hostile), (3, None)):
        assert place(conn, job, number).node == node
        with conn.transaction():
            store.end_attempt(conn, job.id, number, EndReason.EXIT, 1, said)
    first, second, third = store.get(conn, job.id).attempts
    assert first.applied == applied and first.to_json()["applied"] == applied
    assert second.applied == {"user": "x?[2J" + "y" * 195, "limits": {"cpu": "rlimit"}}
    assert third.applied is None and third.to_json()["applied"] is None


def test_unknown_tenant_or_foreign_node_makes_no_job(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(store.TenantNotFound):
        new_job(conn, tenant="nowhere")
    conn.execute("INSERT INTO tenants (name) VALUES ('acme')")
    other = add_node(conn, tenant="acme")
    with pytest.raises(JobError, match=f"node {other} is not a node of tenant default"):
        new_job(conn, node=other)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
