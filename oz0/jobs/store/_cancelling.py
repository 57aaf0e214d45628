"""A cancellation, from the operator who asks for it to the workflow that carries it out: a
job no workflow runs yet ends at once; another's workflow is told by the sweeper (role.py),
which reads here what it still has to send."""

from __future__ import annotations

from oz0 import audit, listing
from oz0.jobs import secret_env
from oz0.jobs.spec import ENDED_STATES, JobEnded, JobNotFound
from oz0.jobs.store._followers import tell_followers
from oz0.jobs.store._reads import get
from oz0.jobs.store._records import Conn, Job


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


def to_cancel(conn: Conn) -> list[tuple[str, str]]:
    """(job, tenant) of the jobs whose workflow is still to be told of a cancellation."""
    rows = conn.execute(
        "SELECT id, tenant FROM jobs WHERE cancel_requested AND NOT cancel_sent"
        " AND workflow_started"
    ).fetchall()
    return [(r[0], r[1]) for r in rows]


def cancel_sent(conn: Conn, job_id: str) -> None:
    conn.execute("UPDATE jobs SET cancel_sent = true WHERE id = %s", (job_id,))
