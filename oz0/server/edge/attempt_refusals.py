"""Attempts a node refused to run (`attempt_refused`), in the audit log at a bounded rate.

A node refuses an attempt whose grant does not hold (docs/node-protocol.md, "Signed
attempts"): someone put work on its queue that the cluster did not sign for it, now,
once. Each refusal is an `attempt.refused` row (actor the node, target the job, details
the attempt and the node's reason, in the node's tenant so that its people see it), but
only the first AUDITED_EACH of each node in each interval: past that, a node (hostile, or
flooded) is counted, and one summary row per node (details `summary`, `count`,
`seconds`) ends the interval. What the node says is its word: the job ID is kept only in
the documented form, the reason cut to MAX_REASON characters.
"""

from __future__ import annotations

import logging
from collections import Counter
from functools import partial
from typing import Any

import psycopg
import trio

from oz0 import audit
from oz0.jobs.spec import is_job_id
from oz0.server.edge.summaries import flush_every
from oz0.store.pool import Database

log = logging.getLogger(__name__)

REFUSED = "attempt_refused"
ACTION = "attempt.refused"
SUMMARY_EVERY = 60.0
AUDITED_EACH = 10
MAX_REASON = 500


class AttemptRefusals:
    def __init__(
        self, db: Database, *, every: float = SUMMARY_EVERY, each: int = AUDITED_EACH
    ) -> None:
        self._db = db
        self._every = every
        self._each = each
        self._written: Counter[str] = Counter()
        # Per node, its tenant and how many refusals went past its budget this interval.
        self._over: dict[str, tuple[str, int]] = {}

    async def refused(self, node_id: str, tenant: str, message: dict[str, Any]) -> None:
        """Audit one refusal NODE_ID (of TENANT) sent, while within its budget."""
        job, attempt, reason = message.get("job"), message.get("attempt"), message.get("reason")
        job = job if isinstance(job, str) and is_job_id(job) else None
        if not isinstance(attempt, int) or isinstance(attempt, bool) or not 0 < attempt < 2**31:
            attempt = None
        reason = reason[:MAX_REASON] if isinstance(reason, str) else "no reason given"
        if self._written[node_id] >= self._each:
            _, count = self._over.get(node_id, (tenant, 0))
            self._over[node_id] = (tenant, count + 1)
            return
        self._written[node_id] += 1
        log.warning("node %s refused job %s attempt %s: %s", node_id, job, attempt, reason)
        details = {"job": job, "attempt": attempt, "reason": reason}
        target = f"job:{job}" if job else f"node:{node_id}"
        await self._db.transaction(partial(_record, node_id, tenant, target, details))

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await flush_every(self._every, self.flush, "refused attempts", task_status=task_status)

    async def flush(self) -> None:
        """One summary row per node that went over its budget; every budget starts anew."""
        self._written.clear()
        over, self._over = self._over, {}
        try:
            for node_id, (tenant, count) in sorted(over.items()):
                details = {"summary": True, "count": count, "seconds": self._every}
                await self._db.transaction(
                    partial(_record, node_id, tenant, f"node:{node_id}", details)
                )
                del over[node_id]
                log.warning(
                    "node %s refused %d attempts over the audit budget in the last %g s",
                    node_id,
                    count,
                    self._every,
                )
        finally:
            # Not written (the database is away): counted again with the next interval's.
            for node_id, (tenant, count) in over.items():
                _, more = self._over.get(node_id, (tenant, 0))
                self._over[node_id] = (tenant, count + more)


def _record(
    node_id: str,
    tenant: str,
    target: str,
    details: dict[str, Any],
    conn: psycopg.Connection[Any],
) -> None:
    audit.record(conn, audit.Actor("node", node_id), ACTION, target, details, tenants=[tenant])
