"""Deleting what the cluster keeps no longer: each tenant's finished jobs (succeeded,
failed, lost, cancelled; never queued or running) whose end is older than its job retention,
with their attempts, output and secrets; files (oz0/file_blobs.py) that no job names any
more and not pushed for that long, and the blobs nothing refers to; and audit rows older
than the audit retention, when one is set (oz0/retention_rules.py has the defaults and
bounds).

One server prunes at a time. Every server looks every CHECK_EVERY whether a pass is due
(`cluster_settings.prune_due_at`, one row); the one whose UPDATE moves it PASS_EVERY ahead
does the pass, the others find it moved and do nothing; a dead pruner's work is taken up at
the next due time by whoever is up. Shortening a retention (`tenant set`, `cluster set`)
makes a pass due at once.

A pass never holds a lock long: it deletes JOBS_PER_BATCH jobs per transaction, their
output first in deletes of OUTPUT_ROWS_PER_DELETE rows (a job may have many thousands),
then audit rows AUDIT_ROWS_PER_BATCH at a time, and sleeps PAUSE between any two of them so
that the fleet's own queries go first. Two passes that overlap (one outran PASS_EVERY) only
both find nothing left to delete. Each pass is one log line with its counts, and counted in
the metrics (oz0_pruned_*).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import trio

from oz0 import audit, file_blobs
from oz0.jobs.spec import ENDED_STATES
from oz0.jobs.store import Conn
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database

log = logging.getLogger(__name__)

PASS_EVERY = 300.0
CHECK_EVERY = 2.0
JOBS_PER_BATCH = 200
OUTPUT_ROWS_PER_DELETE = 5_000
AUDIT_ROWS_PER_BATCH = 1_000
PAUSE = 0.05


@dataclass
class Pruned:
    """What one pass deleted."""

    jobs: int = 0
    attempts: int = 0
    output_rows: int = 0
    audit_rows: int = 0
    files: int = 0
    seconds: float = 0.0

    def describe(self) -> str:
        return (
            f"{self.jobs} jobs ({self.attempts} attempts, {self.output_rows} output rows),"
            f" {self.audit_rows} audit rows, {self.files} files, in {self.seconds:.1f} s"
        )


def claim_pass(conn: Conn, every: float = PASS_EVERY) -> bool:
    """Whether this server is to prune now: True for the one that moved the due time."""
    row = conn.execute(
        "UPDATE cluster_settings SET prune_due_at = now() + make_interval(secs => %s)"
        " WHERE prune_due_at <= now() RETURNING 1",
        (every,),
    ).fetchone()
    return row is not None


def job_retentions(conn: Conn) -> list[tuple[str, int]]:
    return [(str(t), int(s)) for t, s in conn.execute("SELECT name, job_retention_s FROM tenants")]


def expired_jobs(conn: Conn, tenant: str, keep: int, limit: int = JOBS_PER_BATCH) -> list[str]:
    """The oldest LIMIT finished jobs of TENANT that ended more than KEEP seconds ago."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE tenant = %s AND ended_at < now() - make_interval(secs => %s)"
        " AND state = ANY(%s) ORDER BY ended_at LIMIT %s",
        (tenant, keep, list(ENDED_STATES), limit),
    )
    return [str(r[0]) for r in rows]


def delete_some_output(conn: Conn, job_ids: list[str], limit: int = OUTPUT_ROWS_PER_DELETE) -> int:
    """Delete at most LIMIT output rows of JOB_IDS; how many went (0: none left)."""
    deleted = conn.execute(
        "DELETE FROM job_output WHERE id IN ("
        " SELECT id FROM job_output WHERE job_id = ANY(%s) LIMIT %s)",
        (job_ids, limit),
    )
    return deleted.rowcount


def delete_jobs(conn: Conn, job_ids: list[str]) -> tuple[int, int]:
    """Delete JOB_IDS that are still finished, with what is keyed by them (attempts,
    secrets, output left); (jobs, attempts) deleted."""
    attempts = conn.execute(
        "DELETE FROM job_attempts a USING jobs j WHERE a.job_id = j.id AND j.id = ANY(%s)"
        " AND j.state = ANY(%s)",
        (job_ids, list(ENDED_STATES)),
    ).rowcount
    jobs = conn.execute(
        "DELETE FROM jobs WHERE id = ANY(%s) AND state = ANY(%s)", (job_ids, list(ENDED_STATES))
    ).rowcount
    return jobs, attempts


def delete_some_audit(conn: Conn, keep: int, limit: int = AUDIT_ROWS_PER_BATCH) -> int:
    """Delete the oldest audit rows older than KEEP seconds, at most LIMIT of them. Rows are
    taken in the order of their IDs, which is their time's, so that no index on the time is
    needed and a log with nothing to delete costs one short look."""
    deleted = conn.execute(
        "DELETE FROM audit_log WHERE id IN (SELECT id FROM audit_log ORDER BY id LIMIT %s)"
        " AND at < now() - make_interval(secs => %s)",
        (limit, keep),
    )
    return deleted.rowcount


async def prune(
    db: Database, *, pause: float = PAUSE, deleted: Callable[[Pruned], None] = lambda _: None
) -> Pruned:
    """One pass: every tenant's expired jobs, then old audit rows; batch by batch, each
    batch told to DELETED as soon as its transaction committed (a job the API no longer
    finds is counted already, not only at the pass's end)."""
    started = trio.current_time()
    done = Pruned()
    for tenant, keep in await db.transaction(job_retentions):
        while ids := await db.transaction(partial(expired_jobs, tenant=tenant, keep=keep)):
            while rows := await db.transaction(partial(delete_some_output, job_ids=ids)):
                done.output_rows += rows
                deleted(Pruned(output_rows=rows))
                await trio.sleep(pause)
            jobs, attempts = await db.transaction(partial(delete_jobs, job_ids=ids))
            done.jobs += jobs
            done.attempts += attempts
            deleted(Pruned(jobs=jobs, attempts=attempts))
            await trio.sleep(pause)
            if len(ids) < JOBS_PER_BATCH:
                break
    # Files no job names any more (jobs just deleted named some): after the jobs.
    while count := await db.transaction(file_blobs.prune_unused):
        done.files += count
        deleted(Pruned(files=count))
        await trio.sleep(pause)
    keep_audit = await db.transaction(audit.retention)
    if keep_audit is not None:
        while rows := await db.transaction(partial(delete_some_audit, keep=keep_audit)):
            done.audit_rows += rows
            deleted(Pruned(audit_rows=rows))
            await trio.sleep(pause)
            if rows < AUDIT_ROWS_PER_BATCH:
                break
    done.seconds = trio.current_time() - started
    return done


async def run(
    db: Database,
    on_pass: Callable[[Pruned], None] = lambda _: None,
    *,
    deleted: Callable[[Pruned], None] = lambda _: None,
    check_every: float = CHECK_EVERY,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Prune whenever this server wins a due pass; ON_PASS is told what each deleted once
    it ends, DELETED of each batch as it is deleted."""
    outage = Outage("pruning old jobs and audit rows", log)
    task_status.started()
    while True:
        try:
            if await db.transaction(claim_pass):
                done = await prune(db, deleted=deleted)
                log.info("pruned %s", done.describe())
                on_pass(done)
        except DATABASE_ERRORS as e:
            await trio.sleep(outage.failed(e))
            continue
        outage.worked()
        await trio.sleep(check_every)
