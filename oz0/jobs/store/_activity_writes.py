"""What the workflow's activities (activities.py; placement.py places attempts) lock and
write: the job's row, an attempt's end, the reason a job waits, and the job's end."""

from __future__ import annotations

from dataclasses import dataclass

from psycopg.types.json import Jsonb

from oz0.jobs import limits as job_limits
from oz0.jobs import secret_env
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.spec import ENDED_STATES, JobNotFound
from oz0.jobs.store._followers import tell_followers
from oz0.jobs.store._node_fate import _NODE_FATE, gone_because
from oz0.jobs.store._reads import _JOB_COLUMNS
from oz0.jobs.store._records import Conn, Job


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
    because: EndReason | None,
    exit_code: int | None,
    applied: object = None,
    detail: str | None = None,
) -> EndReason:
    """Record how attempt NUMBER ended, what its node said it APPLIED (limits.py; None
    or malformed: not reported) and its DETAIL (the node's words on why it failed it);
    BECAUSE None: from what became of its node. Returns the reason recorded (the first
    one, if it had ended already)."""
    row = conn.execute(
        f"SELECT a.state, a.ended_because, {_NODE_FATE} FROM job_attempts a"
        " LEFT JOIN nodes n ON n.id = a.node_id WHERE a.job_id = %s AND a.number = %s"
        " FOR UPDATE OF a",
        (job_id, number),
    ).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} has no attempt {number}")
    if row[0] == "ended":
        return EndReason(row[1])
    recorded = because or gone_because(row[2])
    kept = job_limits.applied_from_node(applied)
    conn.execute(
        "UPDATE job_attempts SET state = 'ended', ended_at = now(), ended_because = %s,"
        " exit_code = %s, applied = %s, ended_detail = %s, sent = sent - 'secrets'"
        " WHERE job_id = %s AND number = %s",
        (recorded, exit_code, None if kept is None else Jsonb(kept), detail, job_id, number),
    )
    tell_followers(conn, job_id)
    return recorded


def set_queued(conn: Conn, job_id: str, reason: str) -> None:
    conn.execute(
        "UPDATE jobs SET state = 'queued', reason = %s WHERE id = %s AND ended_at IS NULL",
        (reason, job_id),
    )
    tell_followers(conn, job_id)  # the reason it waits, for `job run` to say


@dataclass(frozen=True)
class JobTimes:
    """A job's times as it ended, in seconds from its creation: to its end, and to its
    first attempt placed (None: none was)."""

    total: float
    waited: float | None


def finish(
    conn: Conn, job_id: str, state: str, exit_code: int | None, reason: str | None
) -> JobTimes | None:
    """The job's end; attempts still shown running end with it (cancelled), parts of a
    batch still waiting are not started, and its secrets are deleted. Its times if this
    call ended it; None if it had ended already (a step run again), so that it is
    counted once."""
    assert state in ENDED_STATES
    conn.execute(
        "UPDATE job_parts SET state = 'not started', because = 'job ' || %s"
        " WHERE job_id = %s AND state = 'waiting'",
        (state, job_id),
    )
    conn.execute(
        "UPDATE job_attempts SET state = 'ended', ended_at = now(),"
        " ended_because = %s WHERE job_id = %s AND state = 'running'",
        (EndReason.CANCELLED, job_id),
    )
    # A streamed attempt's sealed secrets are kept no longer than the job's own (the
    # rest of what was sent stays with the attempt, as an activity's input in its history).
    conn.execute(
        "UPDATE job_attempts SET sent = sent - 'secrets' WHERE job_id = %s AND sent ? 'secrets'",
        (job_id,),
    )
    ended = conn.execute(
        "UPDATE jobs SET state = %s, exit_code = %s, reason = %s, ended_at = now()"
        " WHERE id = %s AND ended_at IS NULL"
        " RETURNING extract(epoch FROM ended_at - created_at)::float8,"
        " extract(epoch FROM started_at - created_at)::float8",
        (state, exit_code, reason, job_id),
    ).fetchone()
    secret_env.forget(conn, job_id)
    tell_followers(conn, job_id)
    if ended is None:
        return None
    total, waited = ended
    return JobTimes(max(0.0, float(total)), None if waited is None else max(0.0, float(waited)))
