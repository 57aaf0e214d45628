"""A new job (`job run`, the API, a schedule's run): its row, its sealed secrets and its
audit row, refused past its tenant's cap of queued jobs, which creators of the tenant's jobs
check one at a time."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.types.json import Jsonb

from oz0 import audit, file_blobs, membership
from oz0.jobs import secret_env
from oz0.jobs.spec import JobError, JobNotFound, JobSpec, TooManyQueued, new_job_id
from oz0.jobs.spec_text import DEFAULT_ON_LOST
from oz0.jobs.store._reads import get
from oz0.jobs.store._records import Conn, Job
from oz0_common.file_push import BadPush, PushOrder


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
    _check_push(conn, spec)
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
        " on_lost, lost_after_s, batch, batch_wait_s, max_failures, files)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s,"
        " %s, %s)",
        (
            job_id, spec.tenant, spec.name, Jsonb(spec.command), Jsonb(spec.selector),
            spec.node, spec.all_nodes, Jsonb(spec.env), spec.timeout, spec.queue_timeout,
            spec.retries, spec.no_move, f"{actor.kind}:{actor.name}", Jsonb(spec.limits),
            Jsonb(sorted(spec.secret_env)), spec.on_lost, spec.lost_after, spec.batch,
            spec.batch_wait, spec.max_failures, Jsonb(spec.files),
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


def _check_push(conn: Conn, spec: JobSpec) -> None:
    """A file push's command (oz0_common/file_push.py), and each of its `files`, must name a
    complete file of the job's tenant: its nodes fetch exactly those from their edges."""
    try:
        order = PushOrder.of(spec.command)
        if order is not None:
            file_blobs.check_pushable(conn, spec.tenant, order.sha256, order.size)
        for placed in spec.files:
            file_blobs.check_pushable(conn, spec.tenant, placed["sha256"], placed["size"])
    except (BadPush, file_blobs.FileError) as e:
        raise JobError(str(e)) from None
