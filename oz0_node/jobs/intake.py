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

from temporalio.exceptions import ApplicationError

from oz0_common.attempt_messages import (
    TAKEN,
    AttemptSent,
    AttemptTaken,
    BadAttemptMessage,
    Failure,
    Taken,
)
from oz0_node.jobs.attempt import (
    ATTEMPT_REFUSED,
    NO_WORKDIR,
    REFUSED,
    REPORT_WITHIN,
    AttemptSpec,
    SecretOpener,
)
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.edge_link import LinkDown
from oz0_node.jobs.grants import AttemptRefused, GrantCheck, GrantExpired, RunRecord
from oz0_node.jobs.manager import AttemptManager
from oz0_node.messages import Message

log = logging.getLogger(__name__)

GRANT_EXPIRED = "GrantExpired"


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
        try:
            sent = AttemptSent.parse(message)
        except BadAttemptMessage as e:
            log.warning("ignoring a malformed attempt from the edge: %s", e)
            return
        key = (sent.job, sent.number)
        if key in self._handing:
            self._answer_soon(sent, Taken.WAITING)
            return
        if self.manager.has(*key):
            self._answer_soon(sent, Taken.RUNS)
            return
        self._handing.add(key)  # before any await: a second delivery sees it
        self.manager.start_soon(lambda: self._take(sent))

    def _answer_soon(self, sent: AttemptSent, taken: Taken) -> None:
        self.manager.start_soon(lambda: self._answer(sent, taken))

    async def _take(self, sent: AttemptSent) -> None:
        key = (sent.job, sent.number)
        try:
            record = self.record
            if record is not None and RunRecord.key(*key) in record:
                await self._answer(sent, Taken.RAN)
                return
            if not self.manager.try_reserve():
                await self._answer(sent, Taken.WAITING)
                await self.manager.reserve()
            answer = await self._start(sent)
            if answer is not None:
                await self._answer(sent, *answer)
                return
            await self._answer(sent, Taken.STARTED)
        finally:
            self._handing.discard(key)

    async def _start(self, sent: AttemptSent) -> tuple[Taken, Failure] | None:
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
            return Taken.FAILED, Failure(
                NO_WORKDIR,
                f"job {sent.job} attempt {sent.number}: cannot make its directory on the "
                f"node ({e.filename or 'the attempts directory'}): {e.strerror or e}",
            )
        log.info("job %s attempt %d: handed to its supervisor", sent.job, sent.number)
        return None

    async def _checked(self, sent: AttemptSent) -> SupervisedSpec | tuple[Taken, Failure]:
        """SENT as its supervisor runs it, if its grant and fields hold; else the answer."""
        grants = self.grants
        if grants is None:
            return Taken.FAILED, Failure(NO_WORKDIR, "this node has no grant check yet")
        try:
            grants.check(sent.attempt)
        except GrantExpired as e:
            return Taken.FAILED, Failure(GRANT_EXPIRED, e.reason)
        except AttemptRefused as e:
            await self._tell_refused(sent, e.reason)
            return Taken.REFUSED, Failure(ATTEMPT_REFUSED, e.reason)
        try:
            spec = AttemptSpec.parse(sent.attempt, self.open_secrets)
        except ApplicationError as e:
            return Taken.FAILED, Failure(e.type or "BadAttempt", e.message)
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

    async def _tell_refused(self, sent: AttemptSent, reason: str) -> None:
        log.warning("refused job %s attempt %s: %s", sent.job, sent.number, reason)
        fields = {"job": sent.job, "attempt": sent.number, "reason": reason}
        try:
            await self.manager.link.send(REFUSED, fields, REPORT_WITHIN)
        except LinkDown as e:
            log.warning("cannot report the refusal to the edge: %s", e)

    async def _answer(
        self, sent: AttemptSent, taken: Taken, failure: Failure | None = None
    ) -> None:
        answer = AttemptTaken(sent.job, sent.number, taken, failure)
        try:
            await self.manager.link.send(TAKEN, answer.to_wire(), REPORT_WITHIN)
        except LinkDown as e:
            # The edge sends it again, and is answered then.
            log.info("job %s attempt %d: answer %s not sent: %s", sent.job, sent.number, taken, e)
