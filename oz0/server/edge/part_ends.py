"""The ends of streamed parts (oz0/jobs/parts.py) as nodes report them to this edge:
written in batches, then told to their jobs' workflows, one signal per job for all of its
parts that ended together.

- `record`: a node's report, written with the others that came with it in one
  transaction (store.batches.Batches: one commit for a fan-out's hundred ends, as Nomad
  batches its clients' updates); its answer once committed, so that the node drops its
  report only once the cluster has it.
- `tell`: the recorded end, told to its workflow by `run`'s loop: the ends gathered for
  up to GATHER go out as one `parts_ended` signal per job, at most SIGNALS_AT_ONCE calls
  at a time, then are marked told in one transaction. A workflow not started yet (its
  first part ran before the sweeper's start reached Temporal) is asked again after
  NOT_STARTED_RETRY, twice; an end this loop could not tell the sweeper tells after
  parts.SIGNAL_LATE.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import trio
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from oz0.jobs import parts
from oz0.jobs.worker_loop import JobsUnavailable
from oz0.jobs.workflow import PARTS_ENDED, PartEnd
from oz0.store.batches import Batches
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Conn, Database
from oz0.temporal.namespaces import InNamespace

log = logging.getLogger(__name__)

GATHER = 0.005
SIGNALS_AT_ONCE = 16
CALL_TIMEOUT = 5.0
NOT_STARTED_RETRY = (0.2, 0.8)
QUEUE = 4096


@dataclass(frozen=True)
class Told:
    tenant: str
    job_id: str
    end: PartEnd


def _together(conn: Conn, reports: list[Any]) -> list[tuple[Any, BaseException | None]]:
    return [(recorded, None) for recorded in parts.record_ends(conn, reports)]


class PartEnds:
    def __init__(self, db: Database, in_namespace: Callable[[], InNamespace | None]) -> None:
        self._db = db
        self._in_namespace = in_namespace
        self._writes = Batches(db, (), together=_together)
        self._send, self._receive = trio.open_memory_channel[Told](QUEUE)
        self._outage = Outage("telling workflows of their parts' ends", log)

    async def record(self, report: parts.Report) -> parts.Recorded:
        """REPORT written (with those that came with it); DATABASE_ERRORS if it was not."""
        recorded: parts.Recorded = await self._writes.run(report)
        return recorded

    def tell(self, recorded: parts.Recorded) -> None:
        """RECORDED's end to its workflow, soon; left to the sweeper if too many wait."""
        if recorded.end is None or recorded.tenant is None:
            return
        job_id = recorded.job_id
        assert job_id is not None
        try:
            self._send.send_nowait(Told(recorded.tenant, job_id, recorded.end))
        except trio.WouldBlock:
            log.debug("job %s: its part's end is left to the sweeper to tell", job_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(self._writes.serve)
            task_status.started()
            limiter = trio.CapacityLimiter(SIGNALS_AT_ONCE)
            while True:
                batch = [await self._receive.receive()]
                await trio.sleep(GATHER)
                while True:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except trio.WouldBlock:
                        break
                by_job: dict[tuple[str, str], list[PartEnd]] = defaultdict(list)
                for told in batch:
                    by_job[(told.tenant, told.job_id)].append(told.end)
                for (tenant, job_id), ends in by_job.items():
                    nursery.start_soon(self._signal_safely, limiter, tenant, job_id, ends)

    async def _signal_safely(
        self, limiter: trio.CapacityLimiter, tenant: str, job_id: str, ends: list[PartEnd]
    ) -> None:
        """`_signal`, whose failure (a bug: what Temporal and the database raise is
        handled there) is logged and left to the sweeper, never the edge's end."""
        try:
            await self._signal(limiter, tenant, job_id, ends)
        except Exception:
            log.exception("job %s: telling its workflow of its parts' ends failed", job_id)

    async def _signal(
        self, limiter: trio.CapacityLimiter, tenant: str, job_id: str, ends: list[PartEnd]
    ) -> None:
        in_namespace = self._in_namespace()
        if in_namespace is None:
            return  # no Temporal here: the sweeper tells
        for delay in (0.0, *NOT_STARTED_RETRY):
            await trio.sleep(delay)
            async with limiter:
                answer = await self._call(in_namespace, tenant, _signalling(job_id, ends))
            if answer != "not found":
                break
        if answer != "stored":
            # Not started yet, or ended: the sweeper, which knows which, tells it.
            return
        keys = [(job_id, end.number) for end in ends]
        try:
            await self._db.transaction(lambda conn: parts.ends_signalled(conn, keys))
        except DATABASE_ERRORS as e:
            self._outage.failed(e)  # the sweeper signals again; the workflow ignores it
            return
        self._outage.worked()

    async def _call(
        self, in_namespace: InNamespace, tenant: str, make: Callable[[Client], Awaitable[str]]
    ) -> str:
        try:
            return await in_namespace(tenant, make, CALL_TIMEOUT)
        except (JobsUnavailable, TimeoutError, RPCError) as e:  # the sweeper tells it later
            self._outage.failed(e)
            return "unavailable"


def _signalling(job_id: str, ends: list[PartEnd]) -> Callable[[Client], Awaitable[str]]:
    async def make(client: Client) -> str:
        try:
            await client.get_workflow_handle(job_id).signal(
                PARTS_ENDED, ends, rpc_timeout=dt.timedelta(seconds=CALL_TIMEOUT)
            )
        except RPCError as e:
            return "not found" if e.status == RPCStatusCode.NOT_FOUND else "unavailable"
        return "stored"

    return make
