"""The job workflow's steps that touch the database, run by every server's job worker.

They run in the worker's asyncio thread and query through the server's pool from a thread
of their own (`Database.transaction_in_thread`); each is one transaction and may be run
twice (a retry after a lost answer) with the same result.

Each attempt placed comes back with its grant (grant.py), signed here, by the server that
placed it, once the placement is committed: the node runs only an attempt the cluster
signed, and the workflow passes the grant on as an activity's result (deterministic).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity

from oz0.jobs import placement, store
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.workflow import AttemptEnd, Finish, Placed
from oz0.store.pool import Database

T = TypeVar("T")


class JobActivities:
    def __init__(self, db: Database, signer: AttemptSigner) -> None:
        self.db = db
        self.signer = signer

    async def _run(self, work: Callable[[store.Conn], T]) -> T:
        return await asyncio.to_thread(self.db.transaction_in_thread, work)

    @activity.defn(name="oz0.jobs.place")
    async def place(self, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
        placed, job = await self._run(
            lambda conn: (
                placement.place(conn, job_id, number, part, tried),
                store.locked_job(conn, job_id),
            )
        )
        return self._granted(job, placed)

    @activity.defn(name="oz0.jobs.place_everywhere")
    async def place_everywhere(self, job_id: str, first_number: int) -> list[Placed]:
        placed, job = await self._run(
            lambda conn: (
                placement.place_everywhere(conn, job_id, first_number),
                store.locked_job(conn, job_id),
            )
        )
        return [self._granted(job, p) for p in placed]

    @activity.defn(name="oz0.jobs.place_on")
    async def place_on(self, job_id: str, number: int, part: int, node_id: str) -> dict[str, str]:
        """The attempt's grant, once it is recorded on NODE_ID."""

        def place_on(conn: store.Conn) -> store.Job:
            placement.place_on(conn, job_id, number, part, node_id)
            return store.locked_job(conn, job_id)

        job = await self._run(place_on)
        return self._grant(job, number, node_id)

    def _grant(self, job: store.Job, number: int, node_id: str) -> dict[str, str]:
        # The limits as the workflow passes them: only when some were asked.
        return self.signer.grant(job, number, node_id, limits=job.limits or None)

    def _granted(self, job: store.Job, placed: placement.Placed) -> Placed:
        grant = None if placed.node is None else self._grant(job, placed.number, placed.node)
        return Placed(placed.number, placed.node, placed.reason, placed.ended, placed.part, grant)

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
