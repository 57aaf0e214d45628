"""A job's workflow started once: the sweeper (role.py) claims jobs no server has started,
for a while, and marks them started (streamed, if their attempts go over the stream) or
lets the claim go."""

from __future__ import annotations

import datetime as dt

from oz0.jobs.store._reads import _JOB_COLUMNS
from oz0.jobs.store._records import Conn, Job

# How long a server that claimed a job may take to start its workflow before another may.
START_CLAIM = dt.timedelta(seconds=30)


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
