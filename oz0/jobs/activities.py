"""The job workflow's steps that touch the database, run by every server's job worker.

They run in the worker's asyncio thread and query through the server's pool from a thread
of their own (`Database.transaction_in_thread`); each is one transaction and may be run
twice (a retry after a lost answer) with the same result.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity

from oz0.jobs import placement, store
from oz0.jobs.workflow import AttemptEnd, Finish, Placed
from oz0.store.pool import Database

T = TypeVar("T")


class JobActivities:
    def __init__(self, db: Database) -> None:
        self.db = db

    async def _run(self, work: Callable[[store.Conn], T]) -> T:
        return await asyncio.to_thread(self.db.transaction_in_thread, work)

    @activity.defn(name="oz0.jobs.place")
    async def place(self, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
        placed = await self._run(lambda conn: placement.place(conn, job_id, number, part, tried))
        return Placed(placed.number, placed.node, placed.reason, placed.ended, placed.part)

    @activity.defn(name="oz0.jobs.place_everywhere")
    async def place_everywhere(self, job_id: str, first_number: int) -> list[Placed]:
        placed = await self._run(
            lambda conn: placement.place_everywhere(conn, job_id, first_number)
        )
        return [Placed(p.number, p.node, p.reason, p.ended, p.part) for p in placed]

    @activity.defn(name="oz0.jobs.place_on")
    async def place_on(self, job_id: str, number: int, part: int, node_id: str) -> None:
        await self._run(lambda conn: placement.place_on(conn, job_id, number, part, node_id))

    @activity.defn(name="oz0.jobs.end_attempt")
    async def end_attempt(self, end: AttemptEnd) -> str:
        return await self._run(
            lambda conn: store.end_attempt(
                conn, end.job_id, end.number, end.because, end.exit_code, end.applied
            )
        )

    @activity.defn(name="oz0.jobs.finish")
    async def finish(self, finish: Finish) -> None:
        await self._run(
            lambda conn: store.finish(
                conn, finish.job_id, finish.state, finish.exit_code, finish.reason
            )
        )

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.place,
            self.place_everywhere,
            self.place_on,
            self.end_attempt,
            self.finish,
        ]
