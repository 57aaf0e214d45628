"""The job workflow's steps that touch the database, run by every server's job worker.

They run in the worker's asyncio thread and query through the server's pool from a thread
of their own (`Database.transaction_in_thread`); each is one transaction and may be run
twice (a retry after a lost answer) with the same result.

Placing an attempt also seals the job's secrets to the placed node's key (secret_env.py),
in the same transaction: the sealed string goes to the workflow in the activity's result
(the workflow itself may not read a database). A server that cannot do so fails the step
without retries (SECRETS_UNAVAILABLE), nothing placed, and the workflow fails the job.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0.jobs import placement, secret_env, store
from oz0.jobs.workflow import SECRETS_UNAVAILABLE, AttemptEnd, Finish, Placed
from oz0.store.pool import Database

T = TypeVar("T")


class JobActivities:
    def __init__(self, db: Database, keeper: secret_env.SecretKeeper | None = None) -> None:
        self.db = db
        self.keeper = keeper

    async def _run(self, work: Callable[[store.Conn], T]) -> T:
        try:
            return await asyncio.to_thread(self.db.transaction_in_thread, work)
        except secret_env.SecretsUnavailable as e:
            raise ApplicationError(str(e), type=SECRETS_UNAVAILABLE, non_retryable=True) from None

    def _placed(self, conn: store.Conn, job_id: str, p: placement.Placed) -> Placed:
        """P for the workflow, with the job's secrets sealed to its node for that attempt."""
        sealed = (
            secret_env.for_attempt(conn, self.keeper, job_id, p.number, p.node)
            if p.node is not None
            else ""
        )
        return Placed(p.number, p.node, p.reason, p.ended, p.part, sealed)

    @activity.defn(name="oz0.jobs.place")
    async def place(self, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
        return await self._run(
            lambda conn: self._placed(
                conn, job_id, placement.place(conn, job_id, number, part, tried)
            )
        )

    @activity.defn(name="oz0.jobs.place_everywhere")
    async def place_everywhere(self, job_id: str, first_number: int) -> list[Placed]:
        return await self._run(
            lambda conn: [
                self._placed(conn, job_id, p)
                for p in placement.place_everywhere(conn, job_id, first_number)
            ]
        )

    @activity.defn(name="oz0.jobs.place_on")
    async def place_on(self, job_id: str, number: int, part: int, node_id: str) -> str:
        """The attempt's sealed secrets ("" for a job without)."""

        def work(conn: store.Conn) -> str:
            placement.place_on(conn, job_id, number, part, node_id)
            return secret_env.for_attempt(conn, self.keeper, job_id, number, node_id)

        return await self._run(work)

    @activity.defn(name="oz0.jobs.end_attempt")
    async def end_attempt(self, end: AttemptEnd) -> str:
        return await self._run(
            lambda conn: store.end_attempt(conn, end.job_id, end.number, end.because, end.exit_code)
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
