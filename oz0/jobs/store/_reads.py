"""Reading jobs: one job, a listing of them, the attempts a node ran; each with its attempts
and parts. The column lists here are the Job's and the Attempt's fields in order."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from oz0 import listing
from oz0.jobs.spec import STATES, JobError, JobNotFound
from oz0.jobs.store._records import Attempt, Conn, Job, Part

MAX_LIST = 1000

_JOB_COLUMNS = (
    "id, tenant, name, command, selector, node, all_nodes, env, timeout_s, queue_timeout_s,"
    " retries, no_move, state, reason, exit_code, created_by, created_at, started_at, ended_at,"
    " limits, secret_env, on_lost, lost_after_s, batch, batch_wait_s, max_failures,"
    " schedule_id, cancel_requested, streamed, files"
)
_ATTEMPT_COLUMNS = (
    "number, part, node_id, state, started_at, ended_at, exit_code, ended_because,"
    " output_bytes, truncated, applied, ended_detail"
)


def _attempts(conn: Conn, job_ids: list[str]) -> dict[str, list[Attempt]]:
    found: dict[str, list[Attempt]] = {job_id: [] for job_id in job_ids}
    for row in conn.execute(
        f"SELECT job_id, {_ATTEMPT_COLUMNS} FROM job_attempts WHERE job_id = ANY(%s)"
        " ORDER BY job_id, number",
        (job_ids,),
    ):
        found[row[0]].append(Attempt(*row[1:]))
    return found


def _parts(conn: Conn, job_ids: list[str]) -> dict[str, list[Part]]:
    found: dict[str, list[Part]] = {job_id: [] for job_id in job_ids}
    for row in conn.execute(
        "SELECT job_id, part, node_id, state, because FROM job_parts WHERE job_id = ANY(%s)"
        " ORDER BY job_id, part",
        (job_ids,),
    ):
        found[row[0]].append(Part(*row[1:]))
    return found


def _with_rows(conn: Conn, rows: list[Any]) -> list[Job]:
    """Jobs of ROWS (their _JOB_COLUMNS) with their attempts and parts."""
    ids = [r[0] for r in rows]
    attempts, parts = _attempts(conn, ids), _parts(conn, ids)
    return [
        dataclasses.replace(Job(*r), attempts=tuple(attempts[r[0]]), parts=tuple(parts[r[0]]))
        for r in rows
    ]


@dataclass(frozen=True)
class NodeAttempt:
    """An attempt that ran (or runs) on a node, with what its job is."""

    job_id: str
    job_name: str | None
    command: list[str]
    job_state: str
    attempt: Attempt


def attempts_on_node(conn: Conn, node_id: str, limit: int = 50) -> list[NodeAttempt]:
    """The newest LIMIT attempts placed on NODE_ID, newest first."""
    columns = ", ".join(f"a.{c.strip()}" for c in _ATTEMPT_COLUMNS.split(","))
    rows = conn.execute(
        f"SELECT j.id, j.name, j.command, j.state, {columns} FROM job_attempts a"
        " JOIN jobs j ON j.id = a.job_id WHERE a.node_id = %s"
        " ORDER BY a.started_at DESC, a.job_id, a.number DESC LIMIT %s",
        (node_id, max(1, min(limit, MAX_LIST))),
    ).fetchall()
    return [NodeAttempt(r[0], r[1], r[2], r[3], Attempt(*r[4:])) for r in rows]


def get(conn: Conn, job_id: str, *, scope: listing.Scope = None) -> Job:
    """The job JOB_ID with its attempts; JobNotFound if there is none in SCOPE's tenants
    (None: any), the same answer for another tenant's job as for an unknown ID."""
    where = listing.Where().also("id = %(id)s", id=job_id).within("tenant", scope)
    row = conn.execute(f"SELECT {_JOB_COLUMNS} FROM jobs" + where.sql, where.params).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    [job] = _with_rows(conn, [row])
    return job


def list_jobs(
    conn: Conn,
    *,
    tenant: str | None = None,
    state: str | None = None,
    limit: int = 100,
    offset: int = 0,
    scope: listing.Scope = None,
    schedule: str | None = None,
) -> list[Job]:
    """The newest jobs first, of TENANT and in STATE if given, of SCOPE's tenants (None:
    all); OFFSET skips that many (the web UI's pages). The WHERE names only the filters
    given (listing.Where): a tenant (or a scope of one) reads jobs_listing (tenant,
    created_at DESC), a state jobs_by_state (state, created_at DESC), newest first, in a
    prepared statement's generic plan too; a SCHEDULE's jobs read jobs_by_schedule."""
    if state is not None and state not in STATES:
        raise JobError(f"unknown job state {state!r}: one of {', '.join(STATES)}")
    where = (
        listing.Where()
        .equal("tenant", tenant)
        .equal("state", state)
        .equal("schedule_id", schedule)
        .within("tenant", scope)
    )
    rows = conn.execute(
        f"SELECT {_JOB_COLUMNS} FROM jobs" + where.sql
        + " ORDER BY created_at DESC, id LIMIT %(limit)s OFFSET %(offset)s",
        {**where.params, "limit": max(1, min(limit, MAX_LIST)), "offset": max(0, offset)},
    ).fetchall()  # fmt: skip
    return _with_rows(conn, rows)
