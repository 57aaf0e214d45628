"""Attempts the edge sends over the control stream (`attempt`, docs/node-protocol.md,
"Attempts over the stream"): checked, handed to the attempt manager, answered.

The same checks as an attempt that comes as a Temporal activity (attempt.py): its grant
(grants.py), its fields, its secrets; then a supervisor of its own (manager.py), and from
there on the attempt is like any other: its output relayed, its end reported
(`attempt_done`). In Trio throughout: no asyncio thread on the way.

Each `attempt` is answered `attempt_taken` {"job", "attempt", "taken"}, "taken" being:
- "started": its supervisor runs (answered only then: a node killed before it answers
  has it sent again, and a supervisor that outlives the agent is found by the next);
- "runs": it runs here already (sent again), or "waiting": it waits here for a slot
  (`--max-jobs`); nothing more is started for it;
- "ran": this node ran it before (its grant's record, grants.RunRecord) and has it no
  more: not run twice;
- "refused" {"failure": {"type": "AttemptRefused", "message"}}: its grant does not hold
  (also told as `attempt_refused`, which the edge audits);
- "failed" {"failure": {"type", "message"}}: it could not start (a malformed attempt,
  secrets that do not open, no working directory, an expired grant).
An answer the stream lost is not repeated: the edge sends the attempt again.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

from temporalio.exceptions import ApplicationError

from oz0_node.jobs.attempt import (
    ATTEMPT_REFUSED,
    JOB_ID,
    NO_WORKDIR,
    REFUSED,
    REPORT_WITHIN,
    AttemptSpec,
    SecretOpener,
)
from oz0_node.jobs.edge_link import LinkDown
from oz0_node.jobs.grants import AttemptRefused, GrantCheck, GrantExpired, RunRecord
from oz0_node.jobs.manager import DEFAULT_LOST_AFTER, AttemptManager
from oz0_node.jobs.supervisor import SupervisedSpec
from oz0_node.messages import Message

log = logging.getLogger(__name__)

ATTEMPT = "attempt"
TAKEN = "attempt_taken"
STARTED, RUNS, WAITING, RAN, FAILED = "started", "runs", "waiting", "ran", "failed"
REFUSED_ANSWER = "refused"
GRANT_EXPIRED = "GrantExpired"
MAX_LOST_AFTER = 7 * 86400.0


@dataclass(frozen=True)
class Sent:
    """An `attempt` as the edge sent it: its fields (checked later) and its lost-after."""

    raw: dict[str, Any]
    job_id: str
    number: int
    lost_after: float

    @classmethod
    def parse(cls, message: Message) -> Sent | None:
        raw, lost_after = message.get("attempt"), message.get("lost_after")
        if not isinstance(raw, dict):
            return None
        job_id, number = raw.get("job_id"), raw.get("attempt")
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            return None
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            return None
        if (
            isinstance(lost_after, bool)
            or not isinstance(lost_after, int | float)
            or not math.isfinite(lost_after)
            or not 0 < lost_after <= MAX_LOST_AFTER
        ):
            lost_after = DEFAULT_LOST_AFTER
        return cls(raw, job_id, number, float(lost_after))


class Intake:
    """The agent's intake of streamed attempts (one, across its streams); `grants` is set
    per stream, once the welcome names the node's tenant."""

    def __init__(
        self, manager: AttemptManager, node_id: str, open_secrets: SecretOpener | None
    ) -> None:
        self.manager = manager
        self.node_id = node_id
        self.open_secrets = open_secrets
        self.grants: GrantCheck | None = None
        # Being handed over (waiting for a slot, checked, its supervisor starting).
        self._handing: set[tuple[str, int]] = set()

    @property
    def record(self) -> RunRecord | None:
        return self.grants.record if self.grants is not None else None

    def received(self, message: Message) -> None:
        """An `attempt` from the edge: answered, and started in a task of the manager's
        (never awaited on the stream's receive loop)."""
        sent = Sent.parse(message)
        if sent is None:
            log.warning("ignoring a malformed attempt from the edge")
            return
        key = (sent.job_id, sent.number)
        if key in self._handing:
            self._answer_soon(sent, WAITING)
            return
        if self.manager.has(*key):
            self._answer_soon(sent, RUNS)
            return
        self._handing.add(key)  # before any await: a second delivery sees it
        self.manager.start_soon(lambda: self._take(sent))

    def _answer_soon(self, sent: Sent, taken: str) -> None:
        self.manager.start_soon(lambda: self._answer(sent, taken))

    async def _take(self, sent: Sent) -> None:
        key = (sent.job_id, sent.number)
        try:
            record = self.record
            if record is not None and RunRecord.key(*key) in record:
                await self._answer(sent, RAN)
                return
            if not self.manager.try_reserve():
                await self._answer(sent, WAITING)
                await self.manager.reserve()
            answer = await self._start(sent)
            if answer is not None:
                await self._answer(sent, *answer)
                return
            await self._answer(sent, STARTED)
        finally:
            self._handing.discard(key)

    async def _start(self, sent: Sent) -> tuple[str, dict[str, str]] | None:
        """Check SENT and start its supervisor in the slot reserved, which is its own from
        then (or given back): None once started, else the answer that says why not."""
        try:
            checked = await self._checked(sent)
        except BaseException:
            self.manager.release()
            raise
        if not isinstance(checked, SupervisedSpec):
            self.manager.release()
            return checked
        try:
            await self.manager.start(checked, sent.lost_after)  # gives the slot back
        except OSError as e:
            return FAILED, _failure(
                NO_WORKDIR,
                f"job {sent.job_id} attempt {sent.number}: cannot make its directory on the "
                f"node ({e.filename or 'the attempts directory'}): {e.strerror or e}",
            )
        log.info("job %s attempt %d: handed to its supervisor", sent.job_id, sent.number)
        return None

    async def _checked(self, sent: Sent) -> SupervisedSpec | tuple[str, dict[str, str]]:
        """SENT as its supervisor runs it, if its grant and fields hold; else the answer."""
        grants = self.grants
        if grants is None:
            return FAILED, _failure(NO_WORKDIR, "this node has no grant check yet")
        try:
            grants.check(sent.raw)
        except GrantExpired as e:
            return FAILED, _failure(GRANT_EXPIRED, e.reason)
        except AttemptRefused as e:
            await self._tell_refused(sent, e.reason)
            return REFUSED_ANSWER, _failure(ATTEMPT_REFUSED, e.reason)
        try:
            spec = AttemptSpec.parse(sent.raw, self.open_secrets)
        except ApplicationError as e:
            return FAILED, _failure(e.type or "BadAttempt", e.message)
        return SupervisedSpec(
            node_id=self.node_id,
            job_id=spec.job_id,
            attempt=spec.attempt,
            command=spec.command,
            # The secrets join the job's environment here only: the process's, nowhere else.
            env={**spec.env, **spec.secret_env},
            timeout=spec.timeout,
            limits=spec.limits,
        )

    async def _tell_refused(self, sent: Sent, reason: str) -> None:
        log.warning("refused job %s attempt %s: %s", sent.job_id, sent.number, reason)
        fields = {"job": sent.job_id, "attempt": sent.number, "reason": reason}
        try:
            await self.manager.link.send(REFUSED, fields, REPORT_WITHIN)
        except LinkDown as e:
            log.warning("cannot report the refusal to the edge: %s", e)

    async def _answer(self, sent: Sent, taken: str, failure: dict[str, str] | None = None) -> None:
        fields: Message = {"job": sent.job_id, "attempt": sent.number, "taken": taken}
        if failure is not None:
            fields["failure"] = failure
        try:
            await self.manager.link.send(TAKEN, fields, REPORT_WITHIN)
        except LinkDown as e:
            # The edge sends it again, and is answered then.
            log.info("job %s attempt %d: answer %s not sent: %s", *fields.values(), e)


def _failure(kind: str, message: str) -> dict[str, str]:
    return {"type": kind, "message": message}
