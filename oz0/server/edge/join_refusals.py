"""Refused joins in the audit log at a bounded rate, whatever a flood of them sends.

An operator wants to see each refused join while they are few (which token, which
host) and, under a flood, that there was one and how big: so in every interval the
first `AUDITED_EACH` refusals get a row of their own, and the rest one
`node.join.refused` summary row (target `edge:SERVER`, details `summary`, `count`,
`reasons`, `seconds`) at the end of the interval.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

import psycopg
import trio

from oz0 import audit
from oz0.server.edge.summaries import flush_every
from oz0.store.pool import Database

log = logging.getLogger(__name__)

SUMMARY_EVERY = 60.0
AUDITED_EACH = 20


class JoinRefusals:
    def __init__(
        self,
        db: Database,
        actor: audit.Actor,
        *,
        every: float = SUMMARY_EVERY,
        each: int = AUDITED_EACH,
    ) -> None:
        self._db = db
        self._actor = actor
        self._every = every
        self._each = each
        self._written = 0
        self._summed: Counter[str] = Counter()

    async def refused(self, reason: str, write: Callable[[psycopg.Connection[Any]], None]) -> None:
        """Audit one refusal for REASON: with WRITE while in budget, else in the summary."""
        if self._written < self._each:
            self._written += 1
            await self._db.transaction(write)
        else:
            self._summed[reason] += 1

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await flush_every(self._every, self.flush, "refused joins", task_status=task_status)

    async def flush(self) -> None:
        """Write the summary of this interval, if refusals went over budget, and start anew."""
        self._written = 0
        summed = Counter(self._summed)
        count = sum(summed.values())
        if not count:
            return
        details = {
            "summary": True,
            "count": count,
            "reasons": dict(summed),
            "seconds": self._every,
        }
        await self._db.transaction(
            lambda conn: audit.record(
                conn, self._actor, "node.join.refused", f"edge:{self._actor.name}", details
            )
        )
        # Refusals summed while the row was written wait for the next one.
        self._summed -= summed
        log.warning("refused %d joins over the audit budget in the last %g s", count, self._every)
