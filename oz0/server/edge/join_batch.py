"""Joins with a token, batched: those that arrive together are written in one transaction.

One task writes batches one after another; while it writes one, the joins that arrive
wait and make the next (at most MAX_BATCH). A lone join is written at once, with no
window to wait for company, and under load a batch costs its token lock, its statements
and its commit once for all its joins (oz0.joins).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg.errors
import trio

from oz0 import joins, nodes, pki
from oz0.store.batches import next_batch
from oz0.store.pool import Conn

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_BATCH = 64
# Joins waiting for a batch, beyond which a new one waits to be queued. The edge admits a
# bounded number of connections (oz0.server.admission), so this is rarely reached.
QUEUE = 1024

Transaction = Callable[[Callable[[Conn], Any]], Awaitable[Any]]


@dataclass(eq=False)
class _Waiting:
    request: joins.TokenJoin
    done: trio.Event = field(default_factory=trio.Event)
    joined: nodes.Joined | None = None
    failed: BaseException | None = None


class JoinBatcher:
    def __init__(
        self,
        transaction: Transaction,
        ca: Callable[[], pki.CertificateAuthority],
        *,
        max_batch: int = MAX_BATCH,
    ) -> None:
        """TRANSACTION runs work in one transaction (the edge's, which turns an outage
        into DatabaseUnavailable); CA gives the CA that signs the nodes' certificates."""
        self._transaction = transaction
        self._ca = ca
        self._max_batch = max_batch
        self._send, self._receive = trio.open_memory_channel[_Waiting](QUEUE)

    async def join(self, request: joins.TokenJoin) -> nodes.Joined:
        """REQUEST's node; raises what joining alone would have (TokenRefused,
        NodeError, DatabaseUnavailable)."""
        waiting = _Waiting(request)
        await self._send.send(waiting)
        await waiting.done.wait()
        if waiting.failed is not None:
            raise waiting.failed
        assert waiting.joined is not None
        return waiting.joined

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        again: list[_Waiting] = []
        while True:
            again = await self._write(await next_batch(self._receive, self._max_batch, again))

    async def _write(self, batch: list[_Waiting]) -> list[_Waiting]:
        """Write BATCH and tell each join what became of it; the joins to try again."""
        requests = [w.request for w in batch]
        ca = self._ca()

        def work(conn: Conn) -> list[joins.Outcome]:
            return joins.join_many(conn, ca, requests)

        outcomes: list[joins.Outcome]
        try:
            try:
                outcomes = await self._transaction(work)
            except psycopg.errors.UniqueViolation:
                # A key of this batch joined through another server (or a tokenless join)
                # and committed first; the batch's uses were rolled back with it, and
                # written again it finds that node.
                outcomes = await self._transaction(work)
        except Exception as e:
            for w in batch:
                w.failed = e
                w.done.set()
            return []
        again = []
        for w, outcome in zip(batch, outcomes, strict=True):
            if outcome is None:
                again.append(w)
                continue
            if isinstance(outcome, nodes.Joined):
                w.joined = outcome
            else:
                w.failed = outcome
            w.done.set()
        return again
