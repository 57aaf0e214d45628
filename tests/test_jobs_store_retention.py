"""The jobs' rows on a real PostgreSQL: retention (oz0/jobs/pruner.py) of ended jobs,
their output and the audit log, and the tenant's cap on queued jobs.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them
(fixtures/job_rows.py).
"""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import (
    ADMIN,
    add_node,
    ended_ago,
    new_job,
    place,
    prune,
)
from oz0 import audit, tenants
from oz0.jobs import pruner, store
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.spec import JobSpec, TooManyQueued

CLEAN = job_rows.CLEAN


# --- retention (pruner.py) and the queued-jobs cap --------------------------------------


def ended_with_output(conn: psycopg.Connection[Any], node: str, chunks: int) -> store.Job:
    """A job that ran on NODE, wrote CHUNKS rows of output and ended, as its workflow's
    steps record it."""
    job = new_job(conn, node=node)
    assert place(conn, job, 1).node == node
    with conn.transaction():
        for seq in range(chunks):
            assert store.append_output(conn, node, job.id, 1, seq, "stdout", b"line\n", False)
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
        store.finish(conn, job.id, "succeeded", 0, None)
    return job


def rows_of(conn: psycopg.Connection[Any], job_id: str) -> tuple[int, int, int]:
    """(job rows, attempt rows, output rows) kept of JOB_ID."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE id = %(j)s),"
        " (SELECT count(*) FROM job_attempts WHERE job_id = %(j)s),"
        " (SELECT count(*) FROM job_output WHERE job_id = %(j)s)",
        {"j": job_id},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def test_a_finished_job_past_its_tenants_retention_goes_with_its_attempts_and_output(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    node = add_node(conn)
    old, young = ended_with_output(conn, node, 3), ended_with_output(conn, node, 2)
    ended_ago(conn, old, 31)  # the default retention is 30 days
    ended_ago(conn, young, 29)
    assert rows_of(conn, old.id) == (1, 1, 3)
    # Each batch is told as soon as it is deleted (the metrics count it then, not at the
    # pass's end: a job the API no longer finds is counted already).
    told: list[tuple[pruner.Pruned, tuple[int, int, int]]] = []
    done = prune(one_cluster, lambda batch: told.append((batch, rows_of(conn, old.id))))
    assert (done.jobs, done.attempts, done.output_rows) == (1, 1, 3)
    assert [(b.output_rows, b.jobs, b.attempts) for b, _ in told] == [(3, 0, 0), (0, 1, 1)]
    assert [rows for _, rows in told] == [(1, 1, 0), (0, 0, 0)]
    assert rows_of(conn, old.id) == (0, 0, 0)
    assert rows_of(conn, young.id) == (1, 1, 2)
    # A shorter retention of the tenant's own takes the younger one too.
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(job_retention=7 * 86400), ADMIN)
    assert prune(one_cluster).jobs == 1 and rows_of(conn, young.id) == (0, 0, 0)


def test_queued_and_running_jobs_are_never_pruned_however_old(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    node = add_node(conn)
    queued, running = new_job(conn), new_job(conn, node=node)
    assert place(conn, running, 1).node == node
    conn.execute("UPDATE jobs SET created_at = now() - interval '400 days'")
    # Even a row that says it ended long ago is kept while its state is not an end.
    conn.execute("UPDATE jobs SET ended_at = now() - interval '400 days' WHERE id = %s",
                 (running.id,))  # fmt: skip
    assert prune(one_cluster).jobs == 0
    assert rows_of(conn, queued.id)[0] == 1 and rows_of(conn, running.id)[:2] == (1, 1)


def test_an_expired_jobs_output_goes_in_deletes_of_a_bounded_number_of_rows(
    conn: psycopg.Connection[Any],
) -> None:
    job = ended_with_output(conn, add_node(conn), 5)
    ended_ago(conn, job, 31)
    with conn.transaction():
        [expired] = pruner.expired_jobs(conn, "default", 30 * 86400)
    assert expired == job.id
    counts = []
    while True:
        with conn.transaction():
            deleted = pruner.delete_some_output(conn, [job.id], limit=2)
        if not deleted:
            break
        counts.append(deleted)
    assert counts == [2, 2, 1]
    with conn.transaction():
        assert pruner.delete_jobs(conn, [job.id]) == (1, 1)


def test_audit_rows_are_pruned_only_when_the_cluster_sets_a_retention(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    for age in (500, 10, 0):
        audit.record(conn, ADMIN, "test.row", f"test:{age}")
        conn.execute(
            "UPDATE audit_log SET at = now() - make_interval(days => %s) WHERE target = %s",
            (age, f"test:{age}"),
        )
    assert prune(one_cluster).audit_rows == 0, "kept for ever by default"
    with conn.transaction():
        assert audit.set_retention(conn, 30 * 86400, ADMIN) is None
    assert prune(one_cluster).audit_rows == 1
    targets = [r[0] for r in conn.execute("SELECT target FROM audit_log ORDER BY id")]
    assert targets == ["test:10", "test:0", "cluster"]
    [details] = conn.execute(
        "SELECT details FROM audit_log WHERE action = 'cluster.set'"
    ).fetchone() or [None]
    assert details == {"audit_retention": {"from": "keep", "to": "30d"}}


def test_one_server_claims_a_due_pruning_pass_and_a_shorter_retention_makes_one_due(
    conn: psycopg.Connection[Any],
) -> None:
    with conn.transaction():
        assert pruner.claim_pass(conn)
    with conn.transaction():
        assert not pruner.claim_pass(conn), "the next pass is PASS_EVERY away"
    with conn.transaction():
        before, after = tenants.change(
            conn, "default", tenants.Settings(job_retention=12 * 3600), ADMIN
        )
    assert (before.job_retention, after.job_retention) == (30 * 86400, 12 * 3600)
    with conn.transaction():
        assert pruner.claim_pass(conn)
    [details] = conn.execute(
        "SELECT details FROM audit_log WHERE action = 'tenant.set'"
    ).fetchone() or [None]
    assert details == {"job_retention": {"from": "30d", "to": "12h"}}


def test_a_job_past_the_tenants_queued_cap_is_refused_and_nothing_is_made(
    conn: psycopg.Connection[Any],
) -> None:
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(max_queued_jobs=2), ADMIN)
    first, _ = new_job(conn), new_job(conn)
    with pytest.raises(TooManyQueued) as refused:
        new_job(conn)
    assert str(refused.value) == (
        "tenant default has 2 jobs queued, its limit (tenant set --max-queued-jobs);"
        " wait or cancel some"
    )
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'job.run'").fetchone() == (
        2,
    )
    with conn.transaction():
        store.request_cancel(conn, first.id, ADMIN)
    new_job(conn)  # one left the queue: room for one


def test_jobs_run_at_once_cannot_pass_the_queued_cap_together(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    cap, tries = 3, 12
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(max_queued_jobs=cap), ADMIN)
    start = threading.Barrier(tries)
    outcomes: list[str] = []

    def run_one() -> None:
        with psycopg.connect(one_cluster.main_db, autocommit=True) as mine:
            spec = JobSpec.from_json({"command": ["true"]})
            start.wait(timeout=10)
            try:
                with mine.transaction():
                    store.create(mine, spec, ADMIN)
                outcomes.append("made")
            except TooManyQueued:
                outcomes.append("refused")

    threads = [threading.Thread(target=run_one) for _ in range(tries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["made"] * cap + ["refused"] * (tries - cap)
    assert conn.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone() == (cap,)
