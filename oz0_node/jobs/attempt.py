"""`oz0.job.attempt`: one attempt of a job, run as a process on this node.

The workflow (server side) schedules it on the node's own task queue with one JSON
object (docs/node-protocol.md, "Jobs"). Before anything else, its grant is checked
(grants.py): an attempt the cluster did not sign for this node, now, once, is refused
(non-retryable AttemptRefused), reported to the edge (`attempt_refused`), and not run.
The command runs with no shell, stdin from /dev/null, in a session of its own, as the job
user, in a clean environment and a fresh directory of its own that is removed when the
attempt ends, whatever ends it, with the limits it asked for (isolation.py says how). Its
output goes to the edge as it
comes (output.py). It ends by:

- exiting: then whatever it left running (double-forked, setsid, daemonised: its cgroup or
  its tracked descendants) is ended too, the output is flushed, and the result says how it
  exited, and what isolation and limits were applied;
- its timeout: its processes get SIGTERM, SIGKILL after KILL_GRACE; `ended_because` timeout;
- cancellation (the workflow cancels it; the worker sees that through a heartbeat): its
  processes are ended the same way and CancelledError goes on up;
- the cluster saying, in an output ack, that the attempt has ended here: its processes are
  ended and the activity fails with AttemptEnded;
- the runtime stopping (block, purge, SIGTERM, stream lost): `RunningAttempts.stop_all`
  ends its processes before the worker stops, and the activity fails with NodeStopping.

An attempt may carry the job's secrets (`secrets`: sealed to this node's key for this job,
attempt and node; oz0_common/sealed_env.py). They are opened with the node's key as the
attempt is read and given to the process's environment only: never logged, never in the
status or an error message. Secrets that do not open fail the attempt (SecretsUnreadable,
not retried here: the workflow places it again, sealed to the node's key as it is then).

Runs in the runtime's asyncio loop (temporalio is asyncio-only), never in Trio.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
import subprocess
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0_common import certs, sealed_env
from oz0_node.identity import IdentityDir
from oz0_node.jobs.grants import AttemptRefused, GrantCheck
from oz0_node.jobs.isolation import Isolation, Limits, Placement, parse_limits
from oz0_node.jobs.link import LinkDown, OutputLink
from oz0_node.jobs.output import AttemptEnded, OutputRelay
from oz0_node.jobs.process import KILL_GRACE, REAP_TIMEOUT, Child, spawn
from oz0_node.jobs.tracking import SCAN_EVERY, SUBREAPER

log = logging.getLogger(__name__)

ACTIVITY = "oz0.job.attempt"
HEARTBEAT_EVERY = 1.0
# Once the group is gone, how long its pipes may stay open (held by a process that left
# the group with setsid) before the attempt stops reading them. Not shorter: on a loaded
# machine the readers may be that late for what is already in the pipes.
DRAIN_TIMEOUT = 5.0
# How long stop_all waits for the attempts it ends (their kill is bounded by these).
STOP_ALL_TIMEOUT = KILL_GRACE + REAP_TIMEOUT + 1.0
JOB_ID = re.compile(r"job-[0-9a-f]{12}\Z")

# ApplicationError types the workflow tells apart.
BAD_ATTEMPT = "BadAttempt"
ATTEMPT_ENDED = "AttemptEnded"
NODE_STOPPING = "NodeStopping"
NO_WORKDIR = "NoWorkingDirectory"
SECRETS_UNREADABLE = "SecretsUnreadable"

# Opens an attempt's `secrets` (the text, the job ID, the attempt's number): its values,
# or sealed_env.SealedEnvError.
SecretOpener = Callable[[str, str, int], dict[str, str]]
ATTEMPT_REFUSED = "AttemptRefused"
# The message that tells the edge of a refusal, and how long its sending may take.
REFUSED = "attempt_refused"
REPORT_WITHIN = 5.0

T = TypeVar("T")


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


def node_stopping(spec: AttemptSpec) -> ApplicationError:
    return ApplicationError(
        f"job {spec.job_id} attempt {spec.attempt}: the node's runtime is stopping",
        type=NODE_STOPPING,
        non_retryable=True,
    )


@dataclass(eq=False)
class Running:
    """One attempt in progress, as RunningAttempts sees it."""

    spec: AttemptSpec
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)


class RunningAttempts:
    """The attempts one runtime runs, so that its stop can end them before its worker."""

    def __init__(self) -> None:
        self._live: set[Running] = set()
        self._closed = False

    def __len__(self) -> int:
        return len(self._live)

    def enter(self, spec: AttemptSpec) -> Running:
        if self._closed:
            raise node_stopping(spec)
        running = Running(spec)
        self._live.add(running)
        return running

    def leave(self, running: Running) -> None:
        self._live.discard(running)
        running.done.set()

    async def stop_all(self) -> None:
        """End every attempt's processes (SIGTERM, SIGKILL after the grace); no new ones.

        Returns once each has ended its processes, or after STOP_ALL_TIMEOUT."""
        self._closed = True
        live = list(self._live)
        if not live:
            return
        log.info("ending %d running job attempt(s): the runtime stops", len(live))
        for running in live:
            running.stop.set()

        async def all_done() -> None:
            for running in live:
                await running.done.wait()

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_done(), STOP_ALL_TIMEOUT)
        late = [running for running in live if not running.done.is_set()]
        if late:
            log.warning("%d job attempt(s) did not end in %g s", len(late), STOP_ALL_TIMEOUT)


# --- the attempt -----------------------------------------------------------------------


def _result(
    exit_code: int | None,
    signal: int | None,
    ended_because: str,
    relay: OutputRelay,
    complete: bool,
    place: Placement,
) -> dict[str, object]:
    return {
        "exit_code": exit_code,
        "signal": signal,
        "ended_because": ended_because,
        "output_bytes": relay.output_bytes,
        "truncated": relay.truncated,
        "output_complete": complete,
        "applied": place.applied,
    }


async def run_attempt(
    raw: object,
    *,
    node_id: str,
    link: OutputLink,
    attempts: RunningAttempts,
    grants: GrantCheck,
    isolation: Isolation,
    open_secrets: SecretOpener | None = None,
    heartbeat: Callable[[], None] = activity.heartbeat,
) -> dict[str, object]:
    """Run the attempt RAW describes (see the module's docstring); its result object.
    OPEN_SECRETS opens its `secrets` (node_secrets); without it, secrets are refused."""
    await _check_grant(raw, grants, link)
    spec = AttemptSpec.parse(raw, open_secrets)
    running = attempts.enter(spec)
    try:
        try:
            # The secrets join the job's environment here only: the process's, nowhere else.
            env = {**spec.env, **spec.secret_env}
            place = isolation.begin(node_id, spec.job_id, spec.attempt, env, spec.limits)
        except OSError as e:
            raise ApplicationError(
                f"job {spec.job_id} attempt {spec.attempt}: cannot make its working directory "
                f"or cgroup ({e.filename or isolation.temp_dir}): {e.strerror or e}",
                type=NO_WORKDIR,
                non_retryable=True,
            ) from None
        try:
            return await _run(spec, place, isolation, link, running, heartbeat)
        finally:
            isolation.end(place)
    finally:
        attempts.leave(running)


async def _check_grant(raw: object, grants: GrantCheck, link: OutputLink) -> None:
    """Return if RAW's grant holds; else say so to the edge and fail non-retryable."""
    fields = raw if isinstance(raw, dict) else {}
    try:
        grants.check(fields)
        return
    except AttemptRefused as e:
        reason = e.reason
    # The node's word on what it was sent, unchecked: the edge bounds and audits it.
    job_id, number = fields.get("job_id"), fields.get("attempt")
    job_id = job_id if isinstance(job_id, str) and JOB_ID.fullmatch(job_id) else None
    number = number if isinstance(number, int) and not isinstance(number, bool) else None
    log.warning("refused job %s attempt %s: %s", job_id, number, reason)
    try:
        await link.notify(
            REFUSED, {"job": job_id, "attempt": number, "reason": reason}, REPORT_WITHIN
        )
    except LinkDown as e:
        log.warning("cannot report the refusal to the edge: %s", e)
    raise ApplicationError(
        f"job {job_id} attempt {number}: {reason}", type=ATTEMPT_REFUSED, non_retryable=True
    )


async def _run(
    spec: AttemptSpec,
    place: Placement,
    isolation: Isolation,
    link: OutputLink,
    running: Running,
    heartbeat: Callable[[], None],
) -> dict[str, object]:
    relay = OutputRelay(spec.job_id, spec.attempt, link)
    relay.start()
    ended = asyncio.Event()
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(_heartbeats(heartbeat, ended))
            try:
                try:
                    child = await spawn(
                        spec.command,
                        cwd=place.workdir,
                        env=place.env,
                        on_output=relay.add,
                        tracking=place.tracking,
                        preexec=place.preexec,
                    )
                except (OSError, subprocess.SubprocessError) as e:
                    if isinstance(e, OSError):
                        code = 127 if isinstance(e, FileNotFoundError) else 126
                        why = e.strerror or str(e)
                    else:  # the child's steps before exec (cgroup, rlimits, user) failed
                        code, why = 126, "cannot isolate it (cgroup, limits or job user)"
                        log.warning("job %s attempt %d: %s", spec.job_id, spec.attempt, why)
                    relay.add(
                        "stderr", f"oz0-node: cannot run {spec.command[0]!r}: {why}\n".encode()
                    )
                    complete = await _finish(relay, spec, running)
                    return _result(code, None, "exit", relay, complete, place)
                if place.tracking.kind == SUBREAPER:
                    group.create_task(_follow(isolation, place, ended))
                log.info(
                    "job %s attempt %d: started process %d", spec.job_id, spec.attempt, child.pid
                )
                try:
                    return await _supervise(spec, child, relay, running, place)
                finally:
                    # Whatever ended the attempt, nothing of it outlives it.
                    await _to_completion(child.end())
                    child.close()
            finally:
                ended.set()  # the heartbeats stop, and the group ends with them
                await relay.abandon()
    except* Exception as failed:
        _raise_the_one(failed)  # the heartbeats raise nothing: the attempt's own error


async def _follow(isolation: Isolation, place: Placement, ended: asyncio.Event) -> None:
    """Subreaper tracking: look for the attempt's new processes (and reap the adopted ones
    that ended) every SCAN_EVERY, recording them for a next start after a crash."""
    while not ended.is_set():
        if place.tracking.refresh():
            isolation.note(place)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), SCAN_EVERY)


async def _supervise(
    spec: AttemptSpec, child: Child, relay: OutputRelay, running: Running, place: Placement
) -> dict[str, object]:
    try:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(spec.timeout):
                await _first_of(child.exited.wait, running.stop.wait, relay.ended.wait)
    except asyncio.CancelledError:
        log.info("job %s attempt %d: cancelled; ending it", spec.job_id, spec.attempt)
        await _to_completion(child.end())
        raise
    if running.stop.is_set():
        await _to_completion(child.end())
        raise node_stopping(spec)
    if relay.ended.is_set():
        await _to_completion(child.end())
        raise attempt_ended(spec)
    timed_out = not child.exited.is_set()
    if timed_out:
        log.info(
            "job %s attempt %d: timed out after %g s; ending it",
            spec.job_id,
            spec.attempt,
            spec.timeout,
        )
    elif child.tracking.alive():
        log.info(
            "job %s attempt %d: ending what the command left running",
            spec.job_id,
            spec.attempt,
        )
    await _to_completion(child.end())
    with contextlib.suppress(TimeoutError):
        # A pipe held by a process that escaped its tracking is not waited for.
        await asyncio.wait_for(child.pipes_closed.wait(), DRAIN_TIMEOUT)
    complete = await _finish(relay, spec, running)
    code = child.returncode
    signal = -code if code is not None and code < 0 else None
    if timed_out:
        return _result(None, signal, "timeout", relay, complete, place)
    assert code is not None
    exit_code = 128 + signal if signal is not None else code
    return _result(exit_code, signal, "exit", relay, complete, place)


def attempt_ended(spec: AttemptSpec) -> ApplicationError:
    return ApplicationError(
        f"job {spec.job_id} attempt {spec.attempt}: the cluster ended it on this node",
        type=ATTEMPT_ENDED,
        non_retryable=True,
    )


async def _finish(relay: OutputRelay, spec: AttemptSpec, running: Running) -> bool:
    """Flush the output (relay.finish); whether all of it was stored.

    The runtime stopping cuts the flush short (its stream is going): the command has ended,
    so the attempt still returns its result, with its output incomplete."""
    flushed: list[bool] = []

    async def flush() -> None:
        flushed.append(await relay.finish())

    try:
        await _first_of(flush, running.stop.wait)
    except AttemptEnded:
        raise attempt_ended(spec) from None
    if not flushed:
        await relay.abandon()
        return False
    return flushed[0]


class _Woken(Exception):
    """One of _first_of's waits has ended: its task group cancels the others."""


async def _first_of(*waits: Callable[[], Awaitable[object]]) -> None:
    """Return once any of WAITS has returned; the others are cancelled. A wait's
    exception is raised as it is."""

    async def then_stop(wait: Callable[[], Awaitable[object]]) -> None:
        await wait()
        raise _Woken

    try:
        async with asyncio.TaskGroup() as group:
            for wait in waits:
                group.create_task(then_stop(wait))
    except* _Woken:
        pass
    except* Exception as failed:
        _raise_the_one(failed)


def _raise_the_one(failed: BaseExceptionGroup[Exception]) -> NoReturn:
    """Raise the first error of a task group's FAILED as itself, its cause kept."""
    error = failed.exceptions[0]
    raise error from error.__cause__


async def _heartbeats(heartbeat: Callable[[], None], ended: asyncio.Event) -> None:
    """HEARTBEAT every HEARTBEAT_EVERY until ENDED. One that fails stops the beats, not
    the attempt (Temporal's heartbeat timeout then speaks for it)."""
    while not ended.is_set():
        try:
            heartbeat()
        except Exception:
            log.exception("heartbeats stop")
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), HEARTBEAT_EVERY)


async def _to_completion(work: Coroutine[Any, Any, T]) -> T:
    """Await WORK to its end even if cancelled meanwhile (it is bounded), then re-raise."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError
    return result


def attempt_activity(
    node_id: str,
    data_dir: Path,
    link: OutputLink,
    attempts: RunningAttempts,
    grants: GrantCheck,
    isolation: Isolation | None = None,
) -> Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, object]]]:
    """The `oz0.job.attempt` activity of one runtime; ISOLATION the agent's (else what
    this machine allows, with the default job user)."""
    isolated = isolation if isolation is not None else Isolation.detect(data_dir)
    open_secrets = node_secrets(IdentityDir(data_dir), node_id)

    @activity.defn(name=ACTIVITY)
    async def attempt(raw: dict[str, Any]) -> dict[str, object]:
        return await run_attempt(
            raw, node_id=node_id, link=link, attempts=attempts, grants=grants,
            isolation=isolated, open_secrets=open_secrets,
        )  # fmt: skip

    return attempt
