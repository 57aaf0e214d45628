"""The job workflow's steps that touch the database, run by every server's job worker.

They run in the worker's asyncio thread and query through the server's pool from a thread
of their own (`Database.transaction_in_thread`); each is one transaction and may be run
twice with the same result, and nothing more written: a retry after a lost answer, or, as
local activities (JobInput.local_steps), one whose workflow task never completed (its
server stopped), run again by the worker that takes the task next
(tests/test_jobs_store_steps.py runs each twice).

Each attempt placed comes back with its grant (grant.py), signed here, by the server that
placed it, in the placement's transaction: the node runs only an attempt the cluster
signed, and the workflow passes the grant on as an activity's result (deterministic).
Placing an attempt also seals the job's secrets to the placed node's key (secret_env.py),
in the same transaction: the sealed string goes to the workflow in the activity's result
(the workflow itself may not read a database). A server that cannot do so fails the step
without retries (SECRETS_UNAVAILABLE), nothing placed, and the workflow fails the job.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0.jobs import parts, placement, secret_env, store
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.workflow import SECRETS_UNAVAILABLE, AttemptEnd, Finish, Placed
from oz0.store.pool import Database

T = TypeVar("T")


class JobActivities:
    def __init__(
        self,
        db: Database,
        signer: AttemptSigner,
        keeper: secret_env.SecretKeeper | None = None,
        on_ended: Callable[[str, store.JobTimes], None] | None = None,
    ) -> None:
        self.db = db
        self.signer = signer
        self.keeper = keeper
        # Told of each job this server's worker ended (its state and times), once it is
        # committed: the server's metrics.
        self.on_ended = on_ended

    async def _run(self, work: Callable[[store.Conn], T]) -> T:
        try:
            return await asyncio.to_thread(self.db.transaction_in_thread, work)
        except secret_env.SecretsUnavailable as e:
            raise ApplicationError(str(e), type=SECRETS_UNAVAILABLE, non_retryable=True) from None

    @activity.defn(name="oz0.jobs.place")
    async def place(self, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
        return await self._run(
            lambda conn: self._granted(
                conn, store.locked_job(conn, job_id),
                placement.place(conn, job_id, number, part, tried),
            )
        )  # fmt: skip

    @activity.defn(name="oz0.jobs.place_everywhere")
    async def place_everywhere(self, job_id: str, first_number: int) -> list[Placed]:
        def work(conn: store.Conn) -> list[Placed]:
            job = store.locked_job(conn, job_id)
            placed = placement.place_everywhere(conn, job_id, first_number)
            return self._granted_all(conn, job, placed)

        return await self._run(work)

    def first_placed(self, conn: store.Conn, job: store.Job) -> Placed | None:
        """JOB's first attempt placed, granted and sealed in the caller's transaction (the
        sweeper's, as it claims the job to start its workflow), or None for the workflow's
        own first step to place: an `--all` job, a job with secrets (their sealing may fail
        the job, which the workflow does), one cancelled, or one with no node free now
        (recorded queued with the reason, as the step would: the step looks again)."""
        if job.all_nodes and job.streamed and job.batch is None and not job.secret_env:
            self._everywhere_early(conn, job)
            return None
        if job.all_nodes or job.secret_env or job.cancel_requested:
            return None
        placed = placement.place(conn, job.id, 1, 0, [])
        if placed.node is None or placed.ended:
            return None
        return self._granted(conn, store.locked_job(conn, job.id), placed)

    def _everywhere_early(self, conn: store.Conn, job: store.Job) -> None:
        """A streamed `--all` job's parts placed and sent in the claim's transaction, as a
        one-node job's first attempt is: they start while the workflow starts, not after
        its first task's step (which finds them placed, and sends nothing again)."""
        if job.cancel_requested:
            return
        placed = placement.place_everywhere(conn, job.id, 1)
        if placed[0].node is not None:
            self._granted_all(conn, store.locked_job(conn, job.id), placed)

    @activity.defn(name="oz0.jobs.list_parts")
    async def list_parts(self, job_id: str) -> list[Placed]:
        """A rolling batch's parts, recorded waiting: nodes without grants (none is placed)."""
        return await self._run(lambda conn: placement.list_parts(conn, job_id))

    @activity.defn(name="oz0.jobs.place_part")
    async def place_part(self, job_id: str, number: int, part: int, node_id: str) -> Placed:
        """A waiting part's first attempt NUMBER on NODE_ID, with its grant and sealed
        secrets (from now: its slot opened), or why it cannot start there."""

        def work(conn: store.Conn) -> Placed:
            placed = placement.place_part(conn, job_id, number, part, node_id)
            return self._granted(conn, store.locked_job(conn, job_id), placed)

        return await self._run(work)

    @activity.defn(name="oz0.jobs.place_on")
    async def place_on(self, job_id: str, number: int, part: int, node_id: str) -> Placed:
        """Attempt NUMBER recorded on NODE_ID, with its grant and sealed secrets."""

        def work(conn: store.Conn) -> Placed:
            placement.place_on(conn, job_id, number, part, node_id)
            job = store.locked_job(conn, job_id)
            return self._granted(conn, job, Placed(number, node_id, part=part))

        return await self._run(work)

    def _grant(self, job: store.Job, number: int, node_id: str, sealed: str) -> dict[str, str]:
        # The limits as the workflow passes them: only when some were asked; the sealed
        # secrets as the attempt carries them (one opaque string, in the env digest).
        return self.signer.grant(
            job, number, node_id, secrets=sealed or None, limits=job.limits or None
        )

    def _granted(self, conn: store.Conn, job: store.Job, placed: Placed) -> Placed:
        """PLACED for the workflow, with the job's secrets sealed to its node for that
        attempt and its grant; in the placement's transaction."""
        [granted] = self._granted_all(conn, job, [placed])
        return granted

    def _granted_all(self, conn: store.Conn, job: store.Job, placed: list[Placed]) -> list[Placed]:
        """Each of PLACED for the workflow (`_granted`): granted, its secrets sealed; an
        attempt on a node that takes the stream (the job streamed) becomes a row its
        node's edge sends, its grant and secrets kept out of the workflow's history (the
        row has them until the attempt ends). A few statements for all of them."""
        on_nodes = [p.node for p in placed if p.node is not None]
        streaming = parts.take_stream(conn, on_nodes) if job.streamed and on_nodes else set()
        # Placed and sent already (the claim placed them, or this step runs again): the
        # rows stand, nothing is signed or sent again.
        sent_before = parts.streamed_numbers(conn, job.id, [p.number for p in placed])
        out: list[Placed] = []
        sent: list[tuple[int, str, dict[str, Any]]] = []
        for p in placed:
            if p.node is None:
                out.append(p)
                continue
            if p.number in sent_before:
                out.append(dataclasses.replace(p, streamed=True))
                continue
            sealed = (
                secret_env.for_attempt(conn, self.keeper, job.id, p.number, p.node)
                if job.secret_env
                else ""
            )
            grant = self._grant(job, p.number, p.node, sealed)
            if p.node in streaming:
                message = parts.attempt_message(job, p.number, grant, sealed)
                sent.append((p.number, p.node, message))
                out.append(dataclasses.replace(p, streamed=True))
            else:
                out.append(dataclasses.replace(p, grant=grant, secrets=sealed))
        parts.mark_streamed(conn, job.id, sent)
        return out

    @activity.defn(name="oz0.jobs.end_attempt")
    async def end_attempt(self, end: AttemptEnd) -> EndReason:
        return await self._run(
            lambda conn: store.end_attempt(
                conn,
                end.job_id,
                end.number,
                end.because,
                end.exit_code,
                end.applied,
                end.detail,
            )
        )

    @activity.defn(name="oz0.jobs.finish")
    async def finish(self, finish: Finish) -> None:
        times = await self._run(
            lambda conn: store.finish(
                conn, finish.job_id, finish.state, finish.exit_code, finish.reason
            )
        )
        if times is not None and self.on_ended is not None:
            self.on_ended(finish.state, times)

    def all(self) -> list[Callable[..., Any]]:
        return [
            self.place,
            self.place_everywhere,
            self.place_on,
            self.list_parts,
            self.place_part,
            self.end_attempt,
            self.finish,
        ]
