"""Followers' notifications: a job's record changed, and whoever follows it (a long poll of
its output, oz0/jobs/follow.py) reads it again. The writes of this package, placement.py
and parts.py send it."""

from __future__ import annotations

from oz0.jobs.store._records import Conn
from oz0.store.events import JOBS


def tell_followers(conn: Conn, job_id: str) -> None:
    """Tell whoever follows JOB_ID (a long poll of its output, oz0/jobs/follow.py) that its
    record changed. PostgreSQL sends it at the commit, so a follower woken by it finds the
    rows, and only once per transaction however often it was asked."""
    conn.execute("SELECT pg_notify(%s, %s)", (JOBS, job_id))
