"""What `/metrics` reads of the whole cluster from PostgreSQL: nodes by tenant and state,
the servers up, the jobs not ended and how long the oldest have waited.

Every server reports the same cluster-wide values (a dashboard takes their `max`); each
reads them at most once every MAX_AGE however often anyone scrapes, in one transaction. The
jobs are read from their indexes, never the ended ones: `jobs_by_state` for those queued or
running, `jobs_unstarted` for those whose workflow is still to start (a few rows: the
sweepers start each within a second).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from oz0 import membership
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database

log = logging.getLogger(__name__)

MAX_AGE = 5.0
# The jobs counted by state: those not ended. Ended ones are counted as they end, by the
# server that ended them (oz0_job_duration_seconds).
LIVE_JOB_STATES = ("queued", "running")


@dataclass(frozen=True)
class Counted:
    # (tenant, state) -> nodes
    nodes: dict[tuple[str, str], int] = field(default_factory=dict)
    servers_up: int = 0
    # LIVE_JOB_STATES -> jobs, every tenant's
    jobs: dict[str, int] = field(default_factory=dict)
    # Seconds since the oldest queued job was created; 0 with none queued.
    oldest_queued: float = 0.0
    # Seconds since the oldest job whose workflow has not started was created; 0 with none.
    oldest_unstarted: float = 0.0


def count(conn: psycopg.Connection[Any]) -> Counted:
    rows = conn.execute("SELECT tenant, state, count(*) FROM nodes GROUP BY tenant, state")
    nodes = {(str(tenant), str(state)): int(n) for tenant, state, n in rows}
    up = conn.execute(
        "SELECT count(*) FROM servers WHERE last_heartbeat > now() - %s",
        (membership.UP_WINDOW,),
    ).fetchone()
    jobs = {state: 0 for state in LIVE_JOB_STATES}
    oldest_queued = 0.0
    for state, n, age in conn.execute(
        "SELECT state, count(*), extract(epoch FROM now() - min(created_at))::float8 FROM jobs"
        " WHERE state = ANY(%s) GROUP BY state",
        (list(LIVE_JOB_STATES),),
    ):
        jobs[str(state)] = int(n)
        if state == "queued":
            oldest_queued = max(0.0, float(age))
    unstarted = conn.execute(
        "SELECT coalesce(extract(epoch FROM now() - min(created_at))::float8, 0) FROM jobs"
        " WHERE NOT workflow_started"
    ).fetchone()
    return Counted(
        nodes=nodes,
        servers_up=int(up[0]) if up is not None else 0,
        jobs=jobs,
        oldest_queued=oldest_queued,
        oldest_unstarted=max(0.0, float(unstarted[0])) if unstarted is not None else 0.0,
    )


class ClusterCounts:
    """The cluster's counts, read again only when the last read is MAX_AGE old.

    Scrapes that arrive together share one read. A read that fails keeps the last
    counts (their age tells how old) and is not tried again before MAX_AGE either, so a
    database outage costs one failed read per MAX_AGE, not one per scrape.
    """

    def __init__(self, db: Database, max_age: float = MAX_AGE) -> None:
        self._db = db
        self._max_age = max_age
        self._lock = trio.Lock()
        self._tried_at: float | None = None
        self.read_at: float | None = None
        self.counted = Counted()
        self._outage = Outage("counting nodes and jobs for the metrics", log)

    async def fresh(self) -> Counted:
        async with self._lock:
            now = trio.current_time()
            if self._tried_at is None or now - self._tried_at >= self._max_age:
                self._tried_at = now
                try:
                    self.counted = await self._db.transaction(count)
                except DATABASE_ERRORS as e:
                    self._outage.failed(e)
                else:
                    self._outage.worked()
                    self.read_at = now
        return self.counted
