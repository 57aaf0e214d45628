"""`oz0.job.attempt`: one attempt of a job, handed to a supervisor process on this node.

The workflow (server side) schedules it on the node's own task queue with one JSON
object (docs/node-protocol.md, "Jobs"). Before anything else, its grant is checked
(grants.py): an attempt the cluster did not sign for this node, now, once, is refused
(non-retryable AttemptRefused), reported to the edge (`attempt_refused`), and not run.
Then its secrets are opened, and the attempt is handed to the agent's attempt manager
(manager.py), which starts a supervisor process for it (supervisor.py: the command runs
with no shell, stdin from /dev/null, as the job user, in a clean environment and a fresh
directory removed when it ends, with the limits it asked for; isolation.py says how).
Once handed over the activity completes asynchronously (`raise_complete_async`): the node
speaks for the attempt over whatever control stream it has, and the edge speaks to
Temporal for it by activity ID, so neither a server's restart nor the agent's ends it.

Unless its activity is not `attempt-N`: a workflow started before attempts had IDs of their
own (a job queued or running across a rolling upgrade) replays without that patch and
schedules attempts under Temporal's numeric IDs, with the old short heartbeat timeout. No
edge can complete those by ID, so such an attempt is *held*, the old way (`run_held`): the
activity stays open for the command's life, heartbeats on this runtime's worker every
HEARTBEAT_EVERY and returns the attempt's result itself, or fails as the edge would have
failed it. The manager still relays its output, but reports nothing else of it to the edge
(nothing there could act on it). It ends with the runtime (NodeStopping), as attempts did
before the upgrade, and a new agent that finds one ends it: nobody can complete its
activity any more (docs/run-a-cluster.md, "Upgrade a cluster").

An attempt may carry the job's secrets (`secrets`: sealed to this node's key for this job,
attempt and node; oz0_common/sealed_env.py). They are opened with the node's key as the
attempt is read and given to the supervisor over a pipe, for the process's environment
only: never logged, never on disk, never in the status or an error message. Secrets that
do not open fail the attempt (SecretsUnreadable, not retried here: the workflow places it
again, sealed to the node's key as it is then).

Runs in the runtime's asyncio loop (temporalio is asyncio-only), never in Trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0_common import certs, sealed_env
from oz0_common.asyncio_portal import set_result_soon
from oz0_common.attempt_heartbeat import HEARD
from oz0_common.attempt_messages import DEFAULT_LOST_AFTER, JOB_ID
from oz0_common.file_push import PUSH
from oz0_node.identity import IdentityDir
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.edge_link import LinkDown
from oz0_node.jobs.grants import AttemptRefused, GrantCheck, RecordUnwritable
from oz0_node.jobs.isolation import Limits, parse_limits
from oz0_node.jobs.process import KILL_GRACE
from oz0_node.messages import Message

log = logging.getLogger(__name__)

ACTIVITY = "oz0.job.attempt"
# Without a heartbeat timeout in the activity's info (none is ever scheduled so), the
# cluster's default lost-after: DEFAULT_LOST_AFTER.

# ApplicationError types the workflow tells apart.
BAD_ATTEMPT = "BadAttempt"
ATTEMPT_ENDED = "AttemptEnded"
NODE_STOPPING = "NodeStopping"
NO_WORKDIR = "NoWorkingDirectory"
# The node could not record the attempt as run (grants.RecordUnwritable): moved, not failed.
RECORD_UNWRITABLE = "RecordUnwritable"
SECRETS_UNREADABLE = "SecretsUnreadable"

# Opens an attempt's `secrets` (the text, the job ID, the attempt's number): its values,
# or sealed_env.SealedEnvError.
SecretOpener = Callable[[str, str, int], dict[str, str]]
ATTEMPT_REFUSED = "AttemptRefused"
# The message that tells the edge of a refusal, and how long its sending may take.
REFUSED = "attempt_refused"
REPORT_WITHIN = 5.0

# A held attempt's heartbeats: well inside the heartbeat timeout workflows from before the
# upgrade schedule it with (oz0/jobs/workflow/_attempts.py HEARTBEAT_TIMEOUT, 10 s).
HEARTBEAT_EVERY = 1.0
# Why a held attempt is ended when its activity is: cancelled (by its workflow, or gone
# from Temporal), or its worker stopping with the runtime.
CANCELLED = "cancelled"
RUNTIME_STOPPING = "the runtime stopped"
# How long a cancelled held attempt waits for its command to have ended before the
# cancellation is reported (the supervisor's SIGTERM, then SIGKILL after KILL_GRACE).
CANCEL_WITHIN = KILL_GRACE + 5.0

# What a held attempt's manager answers it with once it has ended: the fields an
# attempt_done would carry (one of result, failure, cancelled). Called in Trio's thread.
Answer = Callable[[Message], None]


@dataclass(frozen=True)
class AttemptSpec:
    job_id: str
    attempt: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    limits: Limits = field(default_factory=Limits)
    # Opened from the attempt's `secrets`; never in a repr (nor a log line made from one).
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def parse(cls, raw: object, open_secrets: SecretOpener | None = None) -> AttemptSpec:
        """The attempt RAW describes; a non-retryable BadAttempt error if it is malformed,
        SecretsUnreadable if its secrets do not open with OPEN_SECRETS."""
        if not isinstance(raw, dict):
            raise _bad("the attempt is not a JSON object")
        job_id, number = raw.get("job_id"), raw.get("attempt")
        command, env, timeout = raw.get("command"), raw.get("env") or {}, raw.get("timeout")
        # The job ID names a directory: nothing but the documented form gets that far.
        if not isinstance(job_id, str) or not JOB_ID.fullmatch(job_id):
            raise _bad(f"job_id must be job- and 12 lowercase hex digits, not {job_id!r}")
        if not isinstance(number, int) or isinstance(number, bool) or number < 1:
            raise _bad(f"attempt must be a whole number from 1, not {number!r}")
        if (
            not isinstance(command, list)
            or not command
            or not all(isinstance(a, str) and "\0" not in a for a in command)
            or not command[0]
        ):
            raise _bad("command must be a non-empty list of strings without NUL")
        if not isinstance(env, dict) or not all(
            isinstance(k, str)
            and isinstance(v, str)
            and k
            and "=" not in k
            and "\0" not in k
            and "\0" not in v
            for k, v in env.items()
        ):
            raise _bad("env must map names (no '=' or NUL) to strings without NUL")
        if timeout is not None and (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout <= 0
        ):
            raise _bad(f"timeout must be a positive number of seconds or null, not {timeout!r}")
        limits = parse_limits(raw.get("limits"))
        if isinstance(limits, str):
            raise _bad(limits)
        return cls(
            job_id=job_id,
            attempt=number,
            command=tuple(command),
            env=dict(env),
            timeout=float(timeout) if timeout is not None else None,
            limits=limits,
            secret_env=_secret_env(raw.get("secrets"), job_id, number, open_secrets),
        )


def _secret_env(
    text: object, job_id: str, number: int, open_secrets: SecretOpener | None
) -> dict[str, str]:
    if text is None:
        return {}
    if not isinstance(text, str) or not text:
        raise _bad("secrets must be a non-empty string")
    try:
        if open_secrets is None:
            raise sealed_env.SealedEnvError("this agent has no key to open them with")
        values = open_secrets(text, job_id, number)
    except sealed_env.SealedEnvError as e:
        # The reason only: what the envelope holds is never part of a message.
        raise ApplicationError(
            f"job {job_id} attempt {number}: its secrets cannot be read on this node: {e}",
            type=SECRETS_UNREADABLE,
            non_retryable=True,
        ) from None
    if not all(k and "=" not in k and "\0" not in k and "\0" not in v for k, v in values.items()):
        raise _bad("secrets must map names (no '=' or NUL) to strings without NUL")
    return values


def node_secrets(identity: IdentityDir, node_id: str) -> SecretOpener:
    """Opens attempts' secrets with the node's key as it is on disk when the attempt comes
    (after a renewal, the new one: secrets sealed to the old key are refused)."""

    def open_secrets(text: str, job_id: str, number: int) -> dict[str, str]:
        try:
            key = certs.key_from_pem(identity.key_path.read_bytes())
        except (OSError, ValueError) as e:
            raise sealed_env.SealedEnvError(f"cannot read the node's key: {e}") from None
        return sealed_env.open_sealed(key, text, job_id=job_id, attempt=number, node_id=node_id)

    return open_secrets


def _bad(why: str) -> ApplicationError:
    return ApplicationError(f"bad attempt: {why}", type=BAD_ATTEMPT, non_retryable=True)


class AttemptPort(Protocol):
    """The agent's attempt manager as this activity reaches it (manager_port.ManagerPort)."""

    async def start(
        self,
        spec: SupervisedSpec,
        lost_after: float,
        beat: Callable[[], None],
        answer: Answer | None = None,
    ) -> None: ...

    async def notify(self, kind: str, fields: Message, within: float) -> None: ...

    async def stop(self, job_id: str, attempt: int, why: str) -> None: ...

    async def runs(self, job_id: str, attempt: int) -> bool: ...


async def given_again(raw: object, port: AttemptPort) -> bool:
    """Whether RAW is an attempt this node runs already and reports to the edge: the
    cluster gave it again because no heartbeat of it reached Temporal in time
    (oz0_common/attempt_heartbeat.py). Nothing is started for it: the edge completes the
    activity, which has the same ID, when the attempt ends."""
    fields = raw if isinstance(raw, dict) else {}
    job_id, number = fields.get("job_id"), fields.get("attempt")
    if not (isinstance(job_id, str) and JOB_ID.fullmatch(job_id)):
        return False
    if not isinstance(number, int) or isinstance(number, bool):
        return False
    return await port.runs(job_id, number)


def by_id(raw: object, activity_id: str) -> bool:
    """Whether ACTIVITY_ID is `attempt-N` for RAW's attempt N: scheduled by a workflow
    that has the ID patch, so the edge completes it (else it is held)."""
    return isinstance(raw, dict) and activity_id == f"attempt-{raw.get('attempt')}"


async def hand_over(
    raw: object,
    *,
    node_id: str,
    port: AttemptPort,
    grants: GrantCheck,
    open_secrets: SecretOpener | None = None,
    lost_after: float = DEFAULT_LOST_AFTER,
    beat: Callable[[], None] = lambda: None,
    answer: Answer | None = None,
) -> SupervisedSpec:
    """Check RAW's grant, read it, and hand it to the manager (which starts its supervisor
    once a slot is free, BEAT called meanwhile); what was handed over. OPEN_SECRETS opens
    its `secrets` (node_secrets); without it, secrets are refused. With ANSWER the attempt
    is held: its end is given to ANSWER, not reported to the edge."""
    await _check_grant(raw, grants, port)
    command = raw.get("command") if isinstance(raw, dict) else None
    if isinstance(raw, dict) and (
        raw.get("files") or (isinstance(command, list) and command[:1] == [PUSH])
    ):
        # Files come over the control stream only (jobs/file_push.py, for the intake):
        # refused here rather than run as a command that does not exist.
        raise _bad("an attempt with files comes over the control stream, not as an activity")
    spec = AttemptSpec.parse(raw, open_secrets)
    supervised = SupervisedSpec(
        node_id=node_id,
        job_id=spec.job_id,
        attempt=spec.attempt,
        command=spec.command,
        # The secrets join the job's environment here only: the process's, nowhere else.
        env={**spec.env, **spec.secret_env},
        timeout=spec.timeout,
        limits=spec.limits,
    )
    try:
        await port.start(supervised, lost_after, beat, answer)
    except OSError as e:
        raise ApplicationError(
            f"job {spec.job_id} attempt {spec.attempt}: cannot make its directory on the "
            f"node ({e.filename or 'the attempts directory'}): {e.strerror or e}",
            type=NO_WORKDIR,
            non_retryable=True,
        ) from None
    log.info(
        "job %s attempt %d: handed to its supervisor%s",
        spec.job_id,
        spec.attempt,
        "" if answer is None else " (held: scheduled by a workflow from before the upgrade)",
    )
    return supervised


async def run_held(
    raw: object,
    *,
    node_id: str,
    port: AttemptPort,
    grants: GrantCheck,
    open_secrets: SecretOpener | None = None,
    lost_after: float = DEFAULT_LOST_AFTER,
    heartbeat: Callable[[], None] = lambda: activity.heartbeat(HEARD),
    worker_stopping: Callable[[], bool] = activity.is_worker_shutdown,
) -> dict[str, object]:
    """Hand RAW over as a held attempt and keep this activity open until it has ended,
    HEARTBEAT every HEARTBEAT_EVERY: its result, or its failure raised as the edge would
    have failed its activity. Cancelled, the command is ended first; the cancellation goes
    on up, or, when WORKER_STOPPING (the runtime stops), NodeStopping, as before the
    upgrade."""
    loop = asyncio.get_running_loop()
    answered: asyncio.Future[Message] = loop.create_future()

    def answer(fields: Message) -> None:
        set_result_soon(answered, fields)  # nothing if the runtime's loop is gone

    spec = await hand_over(
        raw, node_id=node_id, port=port, grants=grants, open_secrets=open_secrets,
        lost_after=lost_after, beat=heartbeat, answer=answer,
    )  # fmt: skip
    try:
        fields = await _beating(answered, heartbeat)
    except asyncio.CancelledError:
        stopping = worker_stopping()
        await port.stop(spec.job_id, spec.attempt, RUNTIME_STOPPING if stopping else CANCELLED)
        if stopping:
            raise ApplicationError(
                f"job {spec.job_id} attempt {spec.attempt}: the node's runtime stopped "
                "(an attempt scheduled before the upgrade ends with it)",
                type=NODE_STOPPING,
                non_retryable=True,
            ) from None
        log.info("job %s attempt %d: cancelled; ending it", spec.job_id, spec.attempt)
        # Reported cancelled once the command has ended (the old activity's promise too).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(answered), CANCEL_WITHIN)
        raise
    return returned(fields)


async def _beating(answered: asyncio.Future[Message], heartbeat: Callable[[], None]) -> Message:
    """ANSWERED's fields once it has them, HEARTBEAT called every HEARTBEAT_EVERY until."""
    while True:
        heartbeat()
        try:
            return await asyncio.wait_for(asyncio.shield(answered), HEARTBEAT_EVERY)
        except TimeoutError:
            continue


def returned(fields: Message) -> dict[str, object]:
    """What the activity gives Temporal for an attempt_done's FIELDS: what the edge would
    (oz0/server/edge/attempts.py `settling`): the result, or its failure (non-retryable,
    of the node's type and message)."""
    result = fields.get("result")
    if isinstance(result, dict):
        return result
    failure = fields.get("failure")
    if isinstance(failure, dict):
        raise ApplicationError(
            str(failure.get("message")), type=str(failure.get("type")), non_retryable=True
        )
    # Ended as cancelled while its activity was not: only the cluster's word could do that,
    # which a held attempt never asks for (it sends no attempt_alive).
    raise ApplicationError(
        f"job {fields.get('job')} attempt {fields.get('attempt')}: ended on the node",
        type=NODE_STOPPING,
        non_retryable=True,
    )


async def _check_grant(raw: object, grants: GrantCheck, port: AttemptPort) -> None:
    """Return if RAW's grant holds; else say so to the edge and fail non-retryable."""
    fields = raw if isinstance(raw, dict) else {}
    try:
        grants.check(fields)
        return
    except RecordUnwritable as e:
        # The node's own trouble: the attempt moves (any failure but a refusal does).
        raise ApplicationError(e.reason, type=RECORD_UNWRITABLE, non_retryable=True) from None
    except AttemptRefused as e:
        reason = e.reason
    # The node's word on what it was sent, unchecked: the edge bounds and audits it.
    job_id, number = fields.get("job_id"), fields.get("attempt")
    job_id = job_id if isinstance(job_id, str) and JOB_ID.fullmatch(job_id) else None
    number = number if isinstance(number, int) and not isinstance(number, bool) else None
    log.warning("refused job %s attempt %s: %s", job_id, number, reason)
    try:
        await port.notify(
            REFUSED, {"job": job_id, "attempt": number, "reason": reason}, REPORT_WITHIN
        )
    except LinkDown as e:
        log.warning("cannot report the refusal to the edge: %s", e)
    raise ApplicationError(
        f"job {job_id} attempt {number}: {reason}", type=ATTEMPT_REFUSED, non_retryable=True
    )


def attempt_activity(
    node_id: str,
    data_dir: Path,
    port: AttemptPort,
    grants: GrantCheck,
) -> Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, object]]]:
    """The `oz0.job.attempt` activity of one runtime: hands each attempt to PORT."""
    open_secrets = node_secrets(IdentityDir(data_dir), node_id)
    # Attempts being handed over by this runtime (grant checked, waiting for a slot, their
    # supervisor starting): one given again meanwhile, because its first heartbeat came
    # late (oz0/jobs/heard.py), is the same attempt and starts nothing.
    handing: set[tuple[str, str]] = set()

    @activity.defn(name=ACTIVITY)
    async def attempt(raw: dict[str, Any]) -> dict[str, object]:
        # First of all: the workflow learns that this attempt reached its node (a
        # heartbeat timeout without it is a task Temporal lost on the way, given again).
        activity.heartbeat(HEARD)
        info = activity.info()
        timeout = info.heartbeat_timeout
        lost_after = timeout.total_seconds() if timeout else DEFAULT_LOST_AFTER
        if not by_id(raw, info.activity_id):
            # Scheduled by a workflow from before the upgrade: no edge can complete it.
            return await run_held(
                raw, node_id=node_id, port=port, grants=grants, open_secrets=open_secrets,
                lost_after=lost_after,
            )  # fmt: skip
        # As text: hashable whatever a bad attempt holds (hand_over refuses it, saying why).
        key = (str(raw.get("job_id")), str(raw.get("attempt")))
        if key in handing:
            log.info("job %s attempt %s: given again while it is handed over here", *key)
            activity.raise_complete_async()
        handing.add(key)  # before any await: a second delivery sees it
        try:
            if await given_again(raw, port):
                log.info("job %s attempt %s: given again; it runs here already", *key)
            else:
                await hand_over(
                    raw, node_id=node_id, port=port, grants=grants,
                    open_secrets=open_secrets, lost_after=lost_after,
                    beat=lambda: activity.heartbeat(HEARD),
                )  # fmt: skip
        finally:
            handing.discard(key)
        # From here the node reports on it over its control stream; the edge completes it.
        activity.raise_complete_async()

    return attempt
