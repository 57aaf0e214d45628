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
  secrets that do not open, no working directory, an expired grant, a record of attempts
  run it cannot write: its disk full).
An answer the stream lost is not repeated: the edge sends the attempt again.
"""

from __future__ import annotations

import dataclasses
import logging
from functools import partial

from temporalio.exceptions import ApplicationError

from oz0_common.attempt_messages import (
    TAKEN,
    AttemptSent,
    AttemptTaken,
    BadAttemptMessage,
    Failure,
    Taken,
)
from oz0_common.file_push import BadPush, PushOrder
from oz0_node.jobs import file_push
from oz0_node.jobs.attempt import (
    ATTEMPT_REFUSED,
    NO_WORKDIR,
    RECORD_UNWRITABLE,
    REFUSED,
    REPORT_WITHIN,
    AttemptSpec,
    SecretOpener,
)
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.edge_link import LinkDown
from oz0_node.jobs.grants import (
    AttemptRefused,
    GrantCheck,
    GrantExpired,
    RecordUnwritable,
    RunRecord,
)
from oz0_node.jobs.manager import AttemptManager
from oz0_node.messages import Message

log = logging.getLogger(__name__)

GRANT_EXPIRED = "GrantExpired"
# A `job run --file` file that could not be fetched or did not pass its check.
FILE_REFUSED = "FileRefused"


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
        if isinstance(checked, PushOrder):
            # Run by the agent itself, not a supervisor (file_push.py): no slot held.
            self.manager.release()
            pushes = self.manager.pushes
            assert pushes is not None
            self.manager.start_soon(
                partial(file_push.run, self.manager.link, pushes, sent.job, sent.number, checked)
            )
            log.info("job %s attempt %d: a file push, run by the agent", sent.job, sent.number)
            return None
        if not isinstance(checked, SupervisedSpec):
            self.manager.release()
            return checked
        staged = None
        orders = file_push.parse_files(sent.attempt.get("files"))  # checked: _checked
        if orders:
            staged = file_push.staged_dir(self.manager.data_dir, sent.job, sent.number)
            try:
                placed = await file_push.stage_files(
                    self.manager.link, self.manager.data_dir, sent.job, sent.number, orders
                )
                checked = dataclasses.replace(checked, files=tuple(placed))
            except (file_push.PushRefused, OSError) as e:
                self.manager.release()
                file_push.remove_staged(staged)
                why = str(e) if isinstance(e, file_push.PushRefused) else (e.strerror or str(e))
                return Taken.FAILED, Failure(
                    FILE_REFUSED, f"job {sent.job} attempt {sent.number}: --file: {why}"
                )
        try:
            await self.manager.start(checked, sent.lost_after)  # gives the slot back
        except OSError as e:
            return Taken.FAILED, Failure(
                NO_WORKDIR,
                f"job {sent.job} attempt {sent.number}: cannot make its directory on the "
                f"node ({e.filename or 'the attempts directory'}): {e.strerror or e}",
            )
        finally:
            if staged is not None:
                # Placed in its working directory by now (or never will be).
                file_push.remove_staged(staged)
        log.info("job %s attempt %d: handed to its supervisor", sent.job, sent.number)
        return None

    async def _checked(
        self, sent: AttemptSent
    ) -> SupervisedSpec | PushOrder | tuple[Taken, Failure]:
        """SENT as its supervisor runs it (or the file push it orders), if its grant and
        fields hold; else the answer."""
        grants = self.grants
        if grants is None:
            return Taken.FAILED, Failure(NO_WORKDIR, "this node has no grant check yet")
        try:
            grants.check(sent.attempt)
        except GrantExpired as e:
            return Taken.FAILED, Failure(GRANT_EXPIRED, e.reason)
        except RecordUnwritable as e:
            return Taken.FAILED, Failure(RECORD_UNWRITABLE, e.reason)
        except AttemptRefused as e:
            await self._tell_refused(sent, e.reason)
            return Taken.REFUSED, Failure(ATTEMPT_REFUSED, e.reason)
        try:
            order = PushOrder.of(sent.attempt.get("command") or [])
        except BadPush as e:
            return Taken.FAILED, Failure("BadAttempt", str(e))
        if order is not None:
            if self.manager.pushes is None:
                return Taken.FAILED, Failure("BadAttempt", "this agent takes no file pushes")
            return order
        try:
            spec = AttemptSpec.parse(sent.attempt, self.open_secrets)
        except ApplicationError as e:
            return Taken.FAILED, Failure(e.type or "BadAttempt", e.message)
        try:
            file_push.parse_files(sent.attempt.get("files"))  # fetched in _start
        except BadPush as e:
            return Taken.FAILED, Failure("BadAttempt", str(e))
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
