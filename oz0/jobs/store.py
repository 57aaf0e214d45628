"""The jobs' rows: what operators list and show, and the output nodes send (placement.py
picks and records where attempts run).

The workflow is the job's logic; these rows are its record, written by its activities (and
by the API when it is asked for a job or a cancellation), each change in one transaction.
"""

from __future__ import annotations

import base64
import dataclasses
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from oz0 import audit, listing, membership
from oz0.jobs import limits as job_limits
from oz0.jobs import secret_env
from oz0.jobs.spec import (
    ENDED_STATES,
    STATES,
    JobEnded,
    JobError,
    JobNotFound,
    JobSpec,
    TooManyQueued,
    new_job_id,
)
from oz0.jobs.spec_text import DEFAULT_ON_LOST, LOST_AFTER
from oz0.store.events import JOBS

Conn = psycopg.Connection[Any]
# Raw output kept per attempt (stdout and stderr together); the rest is dropped, marked.
OUTPUT_CAP = 1024 * 1024
MAX_CHUNK = 32 * 1024
# One page of output, whoever reads it (the API, `job logs`, the web UI): at most this many
# chunks (PAGE_CHUNKS unless asked otherwise) and this many bytes, so that a node that sent
# many tiny chunks cannot make one read unbounded.
PAGE_CHUNKS = 500
MAX_PAGE_CHUNKS = 1000
PAGE_BYTES = OUTPUT_CAP
# How long a server that claimed a job may take to start its workflow before another may.
START_CLAIM = dt.timedelta(seconds=30)
MAX_LIST = 1000


@dataclass(frozen=True)
class Attempt:
    number: int
    part: int
    node: str
    state: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    exit_code: int | None
    ended_because: str | None
    output_bytes: int
    truncated: bool
    # What the node said it applied (limits.py); None: it said nothing.
    applied: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "number": self.number,
            "part": self.part,
            "node": self.node,
            "state": self.state,
            "started_at": self.started_at.isoformat(),
            "ended_at": _iso(self.ended_at),
            "exit_code": self.exit_code,
            "ended_because": self.ended_because,
            "output_bytes": self.output_bytes,
            "truncated": self.truncated,
            "applied": self.applied,
        }


@dataclass(frozen=True)
class Part:
    """A rolling batch's part (job_parts): its node, chosen as the job started, and whether
    it waits for a slot, was placed (its attempts tell the rest) or was never started."""

    part: int
    node: str
    state: str
    because: str | None


# A part of an --all job as `job show` counts it.
WAITING, RUNNING_PART, ENDED_PART, NOT_STARTED = "waiting", "running", "ended", "not started"


@dataclass(frozen=True)
class Job:
    id: str
    tenant: str
    name: str | None
    command: list[str]
    selector: dict[str, str]
    node: str | None
    all_nodes: bool
    env: dict[str, str]
    timeout: float | None
    queue_timeout: float
    retries: int
    no_move: bool
    state: str
    reason: str | None
    exit_code: int | None
    created_by: str
    created_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    limits: dict[str, int | float]
    # The names of its secret environment; the values are in job_secrets (secret_env.py).
    secret_env: list[str] = field(default_factory=list)
    # What its attempt does when its node is lost, and after how long (None: the default
    # for on_lost, spec_text.LOST_AFTER).
    on_lost: str = DEFAULT_ON_LOST
    lost_after: float | None = None
    # Its rolling batch (spec.JobSpec): None, every part at once.
    batch: str | None = None
    batch_wait: float = 0.0
    max_failures: str | None = None
    # The schedule whose run made it (schedules.py), if one did.
    schedule_id: str | None = None
    # An operator asked for its cancellation (its workflow may not have heard yet).
    cancel_requested: bool = False
    # Its workflow was started streaming its attempts (parts.py, JobInput.streamed).
    streamed: bool = False
    attempts: tuple[Attempt, ...] = ()
    # A batch job's parts (job_parts); other jobs have none.
    parts: tuple[Part, ...] = ()

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def part_states(self) -> dict[int, str]:
        """Each part of an --all job by number: WAITING, RUNNING_PART, ENDED_PART or
        NOT_STARTED; a part that was placed is where its last attempt is."""
        states = {p.part: p.state for p in self.parts if p.state != "placed"}
        for attempt in self.attempts:  # in order of number: the last one wins
            states[attempt.part] = RUNNING_PART if attempt.state == "running" else ENDED_PART
        return states

    def parts_json(self) -> dict[str, Any] | None:
        """How many parts of an --all job wait, run, have ended or were never started,
        and which nodes wait; None for a job on one node."""
        if not self.all_nodes:
            return None
        states = self.part_states()
        counts = {k: sum(1 for s in states.values() if s == k) for k in _PART_KEYS}
        waiting = [p.node for p in self.parts if states.get(p.part) == WAITING]
        return {
            "total": len(states),
            **{key: counts[state] for state, key in _PART_KEYS.items()},
            "waiting_nodes": waiting,
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "name": self.name,
            "tenant": self.tenant,
            "state": self.state,
            "reason": self.reason,
            "command": self.command,
            "selector": self.selector,
            "node": self.node,
            "all": self.all_nodes,
            "retries": self.retries,
            "timeout": self.timeout,
            "queue_timeout": self.queue_timeout,
            "no_move": self.no_move,
            # Values may be secrets of the operator's: they are kept to run the job, not shown.
            "env": sorted(self.env),
            "secret_env": sorted(self.secret_env),
            "exit_code": self.exit_code,
            "created_at": self.created_at.isoformat(),
            "started_at": _iso(self.started_at),
            "ended_at": _iso(self.ended_at),
            "created_by": self.created_by,
            "limits": self.limits,
            "on_lost": self.on_lost,
            "lost_after": self.lost_after,
            "batch": None
            if self.batch is None
            else {"size": self.batch, "wait": self.batch_wait, "max_failures": self.max_failures},
            "parts": self.parts_json(),
            "schedule": self.schedule_id,
            "attempts": [a.to_json() for a in self.attempts],
        }


_PART_KEYS = {
    WAITING: "waiting", RUNNING_PART: "running", ENDED_PART: "ended", NOT_STARTED: "not_started",
}  # fmt: skip


def _iso(at: dt.datetime | None) -> str | None:
    return at.isoformat() if at else None


def tell_followers(conn: Conn, job_id: str) -> None:
    """Tell whoever follows JOB_ID (a long poll of its output, oz0/jobs/follow.py) that its
    record changed. PostgreSQL sends it at the commit, so a follower woken by it finds the
    rows, and only once per transaction however often it was asked."""
    conn.execute("SELECT pg_notify(%s, %s)", (JOBS, job_id))


_JOB_COLUMNS = (
    "id, tenant, name, command, selector, node, all_nodes, env, timeout_s, queue_timeout_s,"
    " retries, no_move, state, reason, exit_code, created_by, created_at, started_at, ended_at,"
    " limits, secret_env, on_lost, lost_after_s, batch, batch_wait_s, max_failures,"
    " schedule_id, cancel_requested, streamed"
)
_ATTEMPT_COLUMNS = (
    "number, part, node_id, state, started_at, ended_at, exit_code, ended_because,"
    " output_bytes, truncated, applied"
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


class TenantNotFound(JobNotFound):
    pass


@dataclass(frozen=True)
class ScheduledRun:
    """A job a schedule's run makes (schedules.start_run): which schedule, the run's key
    (unique: one job a run), and who made the schedule (the job's creator)."""

    schedule_id: str
    run_key: str
    created_by: str


# The first schema (oz0/store/migrations.py) of a release that runs rolling batches.
BATCH_SCHEMA = 22


def create(
    conn: Conn,
    spec: JobSpec,
    actor: audit.Actor,
    keeper: secret_env.SecretKeeper | None = None,
    *,
    run: ScheduledRun | None = None,
) -> Job:
    """A new job, queued, and its `job.run` audit row; a server starts its workflow. Its
    secret values are sealed by KEEPER (none without one: SecretsUnavailable). TooManyQueued
    if its tenant has its cap of jobs queued already. A schedule's RUN's job is made with
    its workflow started: the run starts it, as its child."""
    row = conn.execute(
        "SELECT max_queued_jobs FROM tenants WHERE name = %s", (spec.tenant,)
    ).fetchone()
    if row is None:
        raise TenantNotFound(f"tenant {spec.tenant} not found")
    if spec.node is not None:
        node = conn.execute("SELECT tenant FROM nodes WHERE id = %s", (spec.node,)).fetchone()
        if node is None or node[0] != spec.tenant:
            raise JobError(f"node {spec.node} is not a node of tenant {spec.tenant}")
    cap = int(row[0])
    if spec.batch is not None and not membership.all_up_at_least(conn, BATCH_SCHEMA):
        raise JobError(
            "--batch waits for the end of the upgrade: a server of an earlier release is up,"
            " and its job worker would start every part at once"
        )
    job_id = new_job_id()
    conn.execute(
        "INSERT INTO jobs (id, tenant, name, command, selector, node, all_nodes, env,"
        " timeout_s, queue_timeout_s, retries, no_move, created_by, limits, secret_env,"
        " on_lost, lost_after_s, batch, batch_wait_s, max_failures)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
        " %s)",
        (
            job_id, spec.tenant, spec.name, Jsonb(spec.command), Jsonb(spec.selector),
            spec.node, spec.all_nodes, Jsonb(spec.env), spec.timeout, spec.queue_timeout,
            spec.retries, spec.no_move, f"{actor.kind}:{actor.name}", Jsonb(spec.limits),
            Jsonb(sorted(spec.secret_env)), spec.on_lost, spec.lost_after, spec.batch,
            spec.batch_wait, spec.max_failures,
        ),
    )  # fmt: skip
    if run is not None:
        conn.execute(
            "UPDATE jobs SET schedule_id = %s, run_key = %s, created_by = %s,"
            " workflow_started = true WHERE id = %s",
            (run.schedule_id, run.run_key, run.created_by, job_id),
        )
    secret_env.keep(conn, keeper, job_id, spec.secret_env)
    audit.record(
        conn,
        actor,
        "job.run",
        f"job:{job_id}",
        {
            "tenant": spec.tenant,
            "command": spec.command,
            "selector": spec.selector,
            "node": spec.node,
            "all": spec.all_nodes,
            "env": sorted(spec.env),
            **({"limits": spec.limits} if spec.limits else {}),
            **({"on_lost": spec.on_lost} if spec.on_lost != DEFAULT_ON_LOST else {}),
            **({"lost_after": spec.lost_after} if spec.lost_after is not None else {}),
            **(
                {
                    "batch": spec.batch,
                    "batch_wait": spec.batch_wait,
                    "max_failures": spec.max_failures,
                }
                if spec.batch is not None
                else {}
            ),
            "secret_env": sorted(spec.secret_env),
            **({"schedule": run.schedule_id, "created_by": run.created_by} if run else {}),
        },
        tenants=[spec.tenant],
    )
    job = get(conn, job_id)
    # Last, so that the tenant's lock is held from here to the commit only.
    _check_queued(conn, spec.tenant, cap)
    return job


def _check_queued(conn: Conn, tenant: str, cap: int) -> None:
    """TooManyQueued if TENANT has more than CAP jobs queued, the one this transaction just
    made among them (the caller's writes are then rolled back). Creators of the tenant's
    jobs take turns from here to their commit (a transaction-scoped lock of the tenant's
    own), so that two at once cannot both see room for one; the count stops past CAP
    (jobs_queued, a partial index), so a full queue costs no more than the cap's rows."""
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('oz0.jobs.create:' || %s))", (tenant,))
    row = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM jobs WHERE tenant = %s AND state = 'queued'"
        " LIMIT %s) AS queued",
        (tenant, cap + 1),
    ).fetchone()
    queued = int(row[0]) - 1 if row else 0
    if queued >= cap:
        raise TooManyQueued(
            f"tenant {tenant} has {queued} jobs queued, its limit (tenant set"
            " --max-queued-jobs); wait or cancel some"
        )


def request_cancel(
    conn: Conn, job_id: str, actor: audit.Actor, *, scope: listing.Scope = None
) -> Job:
    """Cancel a job of SCOPE's tenants (None: any; another's is not found): at once if no
    workflow runs it yet, else its workflow is told."""
    where = listing.Where().also("id = %(id)s", id=job_id).within("tenant", scope)
    row = conn.execute(
        "SELECT state, workflow_started, start_claimed_until > now(), cancel_requested, tenant"
        " FROM jobs" + where.sql + " FOR UPDATE",
        where.params,
    ).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    state, started, claimed, requested, tenant = row
    if state in ENDED_STATES:
        raise JobEnded(f"job {job_id} has ended already ({state})")
    if not requested:
        if not started and not claimed:
            conn.execute(
                "UPDATE jobs SET state = 'cancelled', reason = 'cancelled by an operator',"
                " ended_at = now(), workflow_started = true, cancel_requested = true,"
                " cancel_sent = true WHERE id = %s",
                (job_id,),
            )
            secret_env.forget(conn, job_id)
            tell_followers(conn, job_id)
        else:
            conn.execute("UPDATE jobs SET cancel_requested = true WHERE id = %s", (job_id,))
        audit.record(conn, actor, "job.cancel", f"job:{job_id}", {"was": state}, tenants=[tenant])
    return get(conn, job_id)


# --- the sweeper's work (role.py) -------------------------------------------------------


def claim_unstarted(conn: Conn, limit: int = 50) -> list[Job]:
    """Jobs whose workflow no server has started, claimed for START_CLAIM."""
    rows = conn.execute(
        f"UPDATE jobs SET start_claimed_until = now() + %(claim)s WHERE id IN ("
        " SELECT id FROM jobs WHERE NOT workflow_started"
        "  AND (start_claimed_until IS NULL OR start_claimed_until < now())"
        "  ORDER BY created_at LIMIT %(limit)s FOR UPDATE SKIP LOCKED"
        f") RETURNING {_JOB_COLUMNS}",
        {"claim": START_CLAIM, "limit": limit},
    ).fetchall()
    return [Job(*r) for r in rows]


def started(conn: Conn, job_id: str) -> None:
    conn.execute(
        "UPDATE jobs SET workflow_started = true, start_claimed_until = NULL WHERE id = %s",
        (job_id,),
    )


def set_streamed(conn: Conn, job_ids: list[str]) -> None:
    """JOB_IDS' workflows are started streaming their attempts (parts.py)."""
    conn.execute("UPDATE jobs SET streamed = true WHERE id = ANY(%s)", (job_ids,))


def release_claim(conn: Conn, job_id: str) -> None:
    conn.execute("UPDATE jobs SET start_claimed_until = NULL WHERE id = %s", (job_id,))


def to_cancel(conn: Conn) -> list[tuple[str, str]]:
    """(job, tenant) of the jobs whose workflow is still to be told of a cancellation."""
    rows = conn.execute(
        "SELECT id, tenant FROM jobs WHERE cancel_requested AND NOT cancel_sent"
        " AND workflow_started"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def cancel_sent(conn: Conn, job_id: str) -> None:
    conn.execute("UPDATE jobs SET cancel_sent = true WHERE id = %s", (job_id,))


@dataclass(frozen=True)
class Removed:
    """A running attempt whose node is no longer accepted: its workflow must move it."""

    job_id: str
    tenant: str
    number: int
    because: str


# What became of a node, as gone_because reads it: its state, or for a node no longer
# there, whether it went by a purge (the node answered it, and was forgotten) or a delete;
# a purge's answer can come before any server looked at the `purging` state.
_NODE_FATE = (
    "coalesce(n.state, (SELECT CASE WHEN l.action = 'node.purged' THEN 'purged' END"
    " FROM audit_log l WHERE l.target = 'node:' || a.node_id"
    " AND l.action IN ('node.purged', 'node.delete') ORDER BY l.id DESC LIMIT 1))"
)


def node_fate(conn: Conn, node_id: str) -> str | None:
    """What became of NODE_ID, as _NODE_FATE reads it: its state ("accepted" while it may
    run work), "purged", or None for a node deleted or never known."""
    row = conn.execute(
        f"SELECT {_NODE_FATE} FROM (SELECT %s::text AS node_id) AS a"
        " LEFT JOIN nodes n ON n.id = a.node_id",
        (node_id,),
    ).fetchone()
    return None if row is None or row[0] is None else str(row[0])


def removed_attempts(conn: Conn) -> list[Removed]:
    """The running attempts whose node was taken away, their workflow not told yet."""
    rows = conn.execute(
        f"SELECT a.job_id, j.tenant, a.number, {_NODE_FATE} FROM job_attempts a"
        " JOIN jobs j ON j.id = a.job_id LEFT JOIN nodes n ON n.id = a.node_id"
        " WHERE a.state = 'running' AND NOT a.removal_signalled"
        " AND (n.state IS NULL OR n.state <> 'accepted')"
    ).fetchall()
    return [Removed(r[0], r[1], r[2], gone_because(r[3])) for r in rows]


def removal_signalled(conn: Conn, job_id: str, number: int) -> None:
    conn.execute(
        "UPDATE job_attempts SET removal_signalled = true WHERE job_id = %s AND number = %s",
        (job_id, number),
    )


def gone_because(node_state: str | None) -> str:
    """Why an attempt ended, from what became of its node."""
    if node_state is None:
        return "node deleted"
    return {
        "blocked": "node blocked",
        "purging": "node purged",
        "purged": "node purged",
    }.get(node_state, "node lost")


# --- the workflow's activities (activities.py; placement.py places attempts) ---------


def locked_job(conn: Conn, job_id: str) -> Job:
    """The job's row (without its attempts), locked until the transaction ends."""
    row = conn.execute(
        f"SELECT {_JOB_COLUMNS} FROM jobs WHERE id = %s FOR UPDATE", (job_id,)
    ).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} not found")
    return Job(*row)


def end_attempt(
    conn: Conn,
    job_id: str,
    number: int,
    because: str | None,
    exit_code: int | None,
    applied: object = None,
) -> str:
    """Record how attempt NUMBER ended, and what its node said it APPLIED (limits.py; None
    or malformed: not reported); BECAUSE None: from what became of its node. Returns the
    reason recorded (the first one, if it had ended already)."""
    row = conn.execute(
        f"SELECT a.state, a.ended_because, {_NODE_FATE} FROM job_attempts a"
        " LEFT JOIN nodes n ON n.id = a.node_id WHERE a.job_id = %s AND a.number = %s"
        " FOR UPDATE OF a",
        (job_id, number),
    ).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} has no attempt {number}")
    if row[0] == "ended":
        return str(row[1])
    recorded = because or gone_because(row[2])
    kept = job_limits.applied_from_node(applied)
    conn.execute(
        "UPDATE job_attempts SET state = 'ended', ended_at = now(), ended_because = %s,"
        " exit_code = %s, applied = %s, sent = sent - 'secrets'"
        " WHERE job_id = %s AND number = %s",
        (recorded, exit_code, None if kept is None else Jsonb(kept), job_id, number),
    )
    tell_followers(conn, job_id)
    return recorded


def set_queued(conn: Conn, job_id: str, reason: str) -> None:
    conn.execute(
        "UPDATE jobs SET state = 'queued', reason = %s WHERE id = %s AND ended_at IS NULL",
        (reason, job_id),
    )
    tell_followers(conn, job_id)  # the reason it waits, for `job run` to say


def finish(conn: Conn, job_id: str, state: str, exit_code: int | None, reason: str | None) -> None:
    """The job's end; attempts still shown running end with it (cancelled), parts of a
    batch still waiting are not started, and its secrets are deleted."""
    assert state in ENDED_STATES
    conn.execute(
        "UPDATE job_parts SET state = 'not started', because = 'job ' || %s"
        " WHERE job_id = %s AND state = 'waiting'",
        (state, job_id),
    )
    conn.execute(
        "UPDATE job_attempts SET state = 'ended', ended_at = now(),"
        " ended_because = 'cancelled' WHERE job_id = %s AND state = 'running'",
        (job_id,),
    )
    # A streamed attempt's sealed secrets are kept no longer than the job's own (the
    # rest of what was sent stays with the attempt, as an activity's input in its history).
    conn.execute(
        "UPDATE job_attempts SET sent = sent - 'secrets' WHERE job_id = %s AND sent ? 'secrets'",
        (job_id,),
    )
    conn.execute(
        "UPDATE jobs SET state = %s, exit_code = %s, reason = %s, ended_at = now()"
        " WHERE id = %s AND ended_at IS NULL",
        (state, exit_code, reason, job_id),
    )
    secret_env.forget(conn, job_id)
    tell_followers(conn, job_id)


# --- output (output.py, api.py) ----------------------------------------------------------


def append_output(
    conn: Conn,
    node_id: str,
    job_id: str,
    attempt: int,
    seq: int,
    stream: str,
    data: bytes,
    truncated: bool,
) -> bool:
    """Store a chunk a node sent; False if that attempt no longer runs on that node.

    What goes past OUTPUT_CAP is dropped: the chunk that reaches it (or the node's own
    `truncated` mark) is stored cut, as the attempt's one truncation mark, and every chunk
    after it is acknowledged (True) but stores nothing, whatever its seq. An empty chunk
    that marks nothing stores nothing either (an honest node sends none). A chunk sent
    again (same seq) is stored once. So a node, hostile or not, adds at most one row per
    byte of the cap, plus the mark, to an attempt.

    One job's chunks are written one transaction at a time (a lock of the job's own, held
    to the commit), so they commit in the order of their IDs: a reader's cursor (the last
    ID it has seen) never passes a chunk of that job still to commit. Without it, the parts
    of an `--all` job committing out of ID order made a follower skip chunks.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('oz0.jobs.output:' || %s))", (job_id,))
    row = conn.execute(
        "SELECT state, node_id, output_bytes, truncated FROM job_attempts"
        " WHERE job_id = %s AND number = %s FOR UPDATE",
        (job_id, attempt),
    ).fetchone()
    if row is None or row[0] != "running" or row[1] != node_id:
        return False
    if row[3]:
        return True  # past the mark: acknowledged, so the node moves on; nothing kept
    room = max(0, OUTPUT_CAP - int(row[2]))
    if len(data) > room:
        data, truncated = data[:room], True
    if not data and not truncated:
        return True
    stored = conn.execute(
        "INSERT INTO job_output (job_id, attempt, seq, stream, data, truncated)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
        (job_id, attempt, seq, stream, data, truncated),
    ).fetchone()
    if stored is not None:
        conn.execute(
            "UPDATE job_attempts SET output_bytes = output_bytes + %s,"
            " truncated = truncated OR %s WHERE job_id = %s AND number = %s",
            (len(data), truncated, job_id, attempt),
        )
        tell_followers(conn, job_id)
    return True


# What an attempt is to the node that reports on it (attempts_of_node).
RUNNING, ENDED, CANCELLED, NOT_ITS = "running", "ended", "cancelled", "not its"


def attempts_of_node(conn: Conn, node_id: str, asked: list[tuple[str, int]]) -> list[str]:
    """For each (job, attempt number) in ASKED, in order, what it is to NODE_ID: RUNNING
    (placed on it and not ended), CANCELLED (placed on it and ended with its job's
    cancellation), ENDED (placed on it and ended otherwise), or NOT_ITS (placed on another
    node, or no such attempt). One statement for the batch (the edge's check of a node's
    attempt_alive and attempt_done, oz0/server/edge/attempts.py)."""
    if not asked:
        return []
    rows = conn.execute(
        "SELECT w.i, a.node_id = %s, a.state, a.ended_because"
        " FROM unnest(%s::text[], %s::int[]) WITH ORDINALITY AS w(job_id, number, i)"
        " LEFT JOIN job_attempts a ON a.job_id = w.job_id AND a.number = w.number",
        (node_id, [job for job, _ in asked], [number for _, number in asked]),
    ).fetchall()
    found = {int(r[0]): r[1:] for r in rows}
    answers = []
    for i in range(1, len(asked) + 1):
        mine, state, because = found.get(i, (None, None, None))
        if not mine:
            answers.append(NOT_ITS)
        elif state == "running":
            answers.append(RUNNING)
        else:
            answers.append(CANCELLED if because == "cancelled" else ENDED)
    return answers


def lost_after_of(conn: Conn, job_ids: list[str]) -> dict[str, float]:
    """Each of JOB_IDS' lost-after in seconds, as its workflow has it (a default by its
    on-lost when none was asked: spec_text.LOST_AFTER)."""
    rows = conn.execute(
        "SELECT id, lost_after_s, on_lost FROM jobs WHERE id = ANY(%s)", (job_ids,)
    ).fetchall()
    return {
        str(job): float(seconds)
        if seconds is not None
        else LOST_AFTER.get(str(on_lost), LOST_AFTER["move"])
        for job, seconds, on_lost in rows
    }


@dataclass(frozen=True)
class Chunk:
    cursor: int
    attempt: int
    node: str
    stream: str
    data: bytes
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        """As the API and the web UI's job page send it: the bytes in base64."""
        return {
            "cursor": self.cursor,
            "attempt": self.attempt,
            "node": self.node,
            "stream": self.stream,
            "data": base64.b64encode(self.data).decode(),
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class OutputPage:
    """Chunks in order; `more`: the page stopped at one of its bounds, and the next page
    (after the last chunk's cursor) has more right away."""

    chunks: list[Chunk]
    more: bool

    @property
    def cursor(self) -> int | None:
        return self.chunks[-1].cursor if self.chunks else None


def output_page(
    conn: Conn,
    job_id: str,
    *,
    after: int = 0,
    attempt: int | None = None,
    limit: int = PAGE_CHUNKS,
    max_bytes: int = PAGE_BYTES,
) -> OutputPage:
    """The chunks after cursor AFTER: at most LIMIT of them (1 to MAX_PAGE_CHUNKS) and at
    most MAX_BYTES bytes of output together (but always one chunk, if there is one), so
    that no page costs more than that, however many rows a node made.

    The window sums the bytes in cursor order over at most LIMIT + 1 rows; those past a
    bound come back without their data and only say that there is more.
    """
    limit = max(1, min(limit, MAX_PAGE_CHUNKS))
    rows = conn.execute(
        "SELECT id, attempt, node_id, stream,"
        "   CASE WHEN kept THEN data ELSE ''::bytea END, truncated, kept"
        " FROM (SELECT *, n = 1 OR (n <= %(limit)s AND upto <= %(bytes)s) AS kept"
        "   FROM (SELECT o.id, o.attempt, a.node_id, o.stream, o.data, o.truncated,"
        "       row_number() OVER w AS n, sum(octet_length(o.data)) OVER w AS upto"
        "     FROM job_output o"
        "     JOIN job_attempts a ON a.job_id = o.job_id AND a.number = o.attempt"
        "     WHERE o.job_id = %(job)s AND o.id > %(after)s"
        "       AND (%(attempt)s::int IS NULL OR o.attempt = %(attempt)s)"
        "     WINDOW w AS (ORDER BY o.id)"
        "     ORDER BY o.id LIMIT %(limit)s + 1) AS window_rows) AS page"
        " ORDER BY id",
        {"job": job_id, "after": after, "attempt": attempt, "limit": limit, "bytes": max_bytes},
    ).fetchall()
    chunks = [Chunk(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows if r[6]]
    return OutputPage(chunks, more=len(chunks) < len(rows))
