"""The attempt manager (manager.py, in Trio) as the node runtime's activities reach it from
the runtime's asyncio thread: every call crosses through the agent's portal
(oz0_common/asyncio_portal.py `TrioPortal`). It is the runtime's side of that crossing, so
it runs on the asyncio loop only; the manager it calls runs on Trio only. It is what
attempt.py's activities know as their `AttemptPort`.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable

from oz0_common.asyncio_portal import TrioPortal
from oz0_node.jobs.attempt import Answer
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.manager import AttemptManager
from oz0_node.messages import Message

# The runtime's activities, crossing into Trio: how often one waiting for a
# slot heartbeats, and how long Trio may take to take a call (at once, unless its thread is
# stuck: then the activity says so rather than waiting forever).
BEAT_EVERY = 0.2
CROSS_WITHIN = 5.0


class ManagerPort:
    """The manager as the runtime's asyncio thread uses it: each call crosses into Trio
    through the agent's portal (oz0_common/asyncio_portal.py `TrioPortal`). Made in Trio."""

    def __init__(self, manager: AttemptManager) -> None:
        self.manager = manager
        self._trio = TrioPortal("oz0-attempts")

    async def start(
        self,
        spec: SupervisedSpec,
        lost_after: float,
        beat: Callable[[], None],
        answer: Answer | None = None,
    ) -> None:
        """Start SPEC once a slot is free (BEAT called meanwhile, to keep the activity);
        held if ANSWER (called in Trio's thread)."""
        beating = asyncio.get_running_loop().create_task(_beat_while_waiting(beat))
        try:
            # No bound of its own: the wait for a slot lasts as long as the activity, whose
            # cancellation ends it (the supervisor's launch is bounded: START_WITHIN).
            await self._trio.call(self._start_in_a_slot, spec, lost_after, answer, within=math.inf)
        finally:
            beating.cancel()

    async def _start_in_a_slot(
        self, spec: SupervisedSpec, lost_after: float, answer: Answer | None
    ) -> None:
        # In Trio, one call: a cancellation between taking the slot and starting in it
        # cannot keep the slot (`start` gives it back whatever happens).
        await self.manager.reserve()
        await self.manager.start(spec, lost_after, answer)

    async def runs(self, job_id: str, attempt: int) -> bool:
        """Whether the manager runs that attempt and will report its end (AttemptManager.runs)."""
        return await self._trio.call_sync(self.manager.runs, job_id, attempt, within=CROSS_WITHIN)

    async def notify(self, kind: str, fields: Message, within: float) -> None:
        """Send a KIND nothing answers; LinkDown if no stream takes it within WITHIN."""
        # The link's own bound says LinkDown; the portal's, a moment later, only backs it.
        await self._trio.call(
            self.manager.link.send, kind, fields, within, within=within + CROSS_WITHIN
        )

    async def stop(self, job_id: str, attempt: int, why: str) -> None:
        """End that attempt (its held activity was cancelled); returns at once."""
        self._trio.call_soon(self._stop, job_id, attempt, why)

    def _stop(self, job_id: str, attempt: int, why: str) -> None:
        # The agent may be ending (the manager's nursery closed: RuntimeError): its
        # supervisors are the next agent's to end then.
        with contextlib.suppress(RuntimeError):
            self.manager.stop(job_id, attempt, why)


async def _beat_while_waiting(beat: Callable[[], None]) -> None:
    while True:
        await asyncio.sleep(BEAT_EVERY)
        beat()
