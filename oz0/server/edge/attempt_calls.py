"""The Temporal calls the edge makes for nodes' attempts (attempts.py), run on the jobs
role's asyncio loop (JobsRole.in_namespace: temporalio is asyncio-only): each attempt's
activity heartbeated, completed, failed or reported cancelled, by its activity ID
(namespace: the node's tenant; workflow: the job; activity: `attempt-N`). Each is made on
the Trio side as a function of the client and handed over whole; AttemptRef names an
attempt on both sides.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio.client import AsyncActivityCancelledError, AsyncActivityHandle, Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from oz0_common.attempt_heartbeat import HEARD
from oz0_common.attempt_messages import AttemptDone, BadAttemptMessage, parse_ref


@dataclass(frozen=True)
class AttemptRef:
    """An attempt as a node names it: its job and number."""

    job: str
    number: int

    @property
    def activity_id(self) -> str:
        return f"attempt-{self.number}"

    @classmethod
    def parse(cls, entry: object) -> AttemptRef:
        if not isinstance(entry, dict):
            raise BadAttemptMessage("an attempt is an object with job and attempt")
        return cls(*parse_ref(entry))

    @classmethod
    def of(cls, done: AttemptDone) -> AttemptRef:
        return cls(done.job, done.number)


def _handle(client: Client, ref: AttemptRef) -> AsyncActivityHandle:
    return client.get_async_activity_handle(
        workflow_id=ref.job, run_id=None, activity_id=ref.activity_id
    )


def heartbeats(refs: list[AttemptRef], within: float) -> Callable[[Client], Awaitable[list[str]]]:
    """For each of REFS, heartbeated within WITHIN seconds: "running", "cancelled" (its job
    was cancelled), "ended" (Temporal has no such activity: timed out, or the workflow
    moved on or ended) or "unavailable"."""

    async def beat(client: Client, ref: AttemptRef) -> str:
        try:
            await _handle(client, ref).heartbeat(HEARD, rpc_timeout=dt.timedelta(seconds=within))
        except AsyncActivityCancelledError as e:
            return "cancelled" if e.details is None or e.details.cancel_requested else "running"
        except RPCError as e:
            return "ended" if e.status == RPCStatusCode.NOT_FOUND else "unavailable"
        return "running"

    async def make(client: Client) -> list[str]:
        return list(await asyncio.gather(*(beat(client, r) for r in refs)))

    return make


def settling(done: AttemptDone, within: float) -> Callable[[Client], Awaitable[str]]:
    """DONE given to Temporal within WITHIN seconds: "stored", "ended" (it has no such
    activity) or "unavailable"."""

    async def make(client: Client) -> str:
        ref = AttemptRef.of(done)
        handle, timeout = _handle(client, ref), dt.timedelta(seconds=within)
        try:
            if done.result is not None:
                await handle.complete(done.result.to_wire(), rpc_timeout=timeout)
            elif done.failure is not None:
                failure = done.failure
                error = ApplicationError(failure.message, type=failure.type, non_retryable=True)
                await handle.fail(error, rpc_timeout=timeout)
            else:
                await handle.report_cancellation(rpc_timeout=timeout)
        except RPCError as e:
            return "ended" if e.status == RPCStatusCode.NOT_FOUND else "unavailable"
        return "stored"

    return make
