"""`oz0.job.attempt`: one attempt of a job, run as a process on this node.

The workflow (server side) schedules it on the node's own task queue with one JSON
object (docs/node-protocol.md, "Jobs"). The command runs with no shell, stdin from
/dev/null, in a session of its own, in a fresh directory DATA_DIR/runtimes/JOB-ATTEMPT/
that is removed when the attempt ends, whatever ends it. Its output goes to the edge as it
comes (output.py). It ends by:

- exiting: then whatever it left in its process group is ended too, the output is
  flushed, and the result says how it exited;
- its timeout: the group gets SIGTERM, SIGKILL after KILL_GRACE; `ended_because` timeout;
- cancellation (the workflow cancels it; the worker sees that through a heartbeat): the
  group is ended the same way and CancelledError goes on up;
- the cluster saying, in an output ack, that the attempt has ended here: the group is ended
  and the activity fails with AttemptEnded;
- the runtime stopping (block, purge, SIGTERM, stream lost): `RunningAttempts.stop_all`
  ends the group before the worker stops, and the activity fails with NodeStopping.

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
import os
import re
import shutil
import stat
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

from oz0_common import certs, sealed_env
from oz0_node import layout
from oz0_node.identity import IdentityDir
from oz0_node.jobs.link import OutputLink
from oz0_node.jobs.output import AttemptEnded, OutputRelay
from oz0_node.jobs.process import KILL_GRACE, REAP_TIMEOUT, Child, members, spawn

log = logging.getLogger(__name__)

ACTIVITY = "oz0.job.attempt"
RUNTIMES_DIR = layout.RUNTIMES_DIR
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

T = TypeVar("T")


@dataclass(frozen=True)
class AttemptSpec:
    job_id: str
    attempt: int
    command: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    timeout: float | None = None
    # Opened from the attempt's `secrets`; never in a repr (nor a log line made from one).
    secret_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @property
    def dir_name(self) -> str:
        return f"{self.job_id}-{self.attempt}"

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
        return cls(
            job_id=job_id,
            attempt=number,
            command=tuple(command),
            env=dict(env),
            timeout=float(timeout) if timeout is not None else None,
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


# --- the working directory -------------------------------------------------------------


def runtimes_dir(data_dir: Path) -> Path:
    return data_dir / RUNTIMES_DIR


def fresh_workdir(data_dir: Path, spec: AttemptSpec) -> Path:
    """An empty DATA_DIR/runtimes/JOB-ATTEMPT/ (0700); what a crash left there goes first."""
    parent = runtimes_dir(data_dir)
    parent.mkdir(mode=0o700, exist_ok=True)
    workdir = parent / spec.dir_name
    if workdir.is_symlink() or workdir.exists():
        remove_tree(workdir)
    workdir.mkdir(mode=0o700)
    return workdir


def remove_tree(path: Path) -> None:
    """Delete PATH and all in it, never following a symbolic link; a failure is logged.

    A command may leave directories it made unwritable; those are made writable (never
    through a link) and the removal tried once more."""
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    try:
        shutil.rmtree(path)
        return
    except OSError:
        pass
    for root, dirs, _ in os.walk(path):
        for name in [".", *dirs]:
            with contextlib.suppress(OSError):
                target = Path(root, name)
                if not target.is_symlink():
                    target.chmod(stat.S_IRWXU)
    try:
        shutil.rmtree(path)
    except OSError as e:
        log.warning("cannot remove %s: %s (%s)", path, e.strerror or e, e.filename or path)


# --- the attempt -----------------------------------------------------------------------


def attempt_env(spec: AttemptSpec, node_id: str, data_dir: Path) -> dict[str, str]:
    """The agent's environment, the job's on top (its secrets too), and the three OZ0_ names
    on top of that; DIR/tools/ first on the PATH that results."""
    env = {
        **os.environ,
        **spec.env,
        **spec.secret_env,
        "OZ0_JOB_ID": spec.job_id,
        "OZ0_ATTEMPT": str(spec.attempt),
        "OZ0_NODE_ID": node_id,
    }
    return layout.with_tools_on_path(env, data_dir)


def _result(
    exit_code: int | None,
    signal: int | None,
    ended_because: str,
    relay: OutputRelay,
    complete: bool,
) -> dict[str, object]:
    return {
        "exit_code": exit_code,
        "signal": signal,
        "ended_because": ended_because,
        "output_bytes": relay.output_bytes,
        "truncated": relay.truncated,
        "output_complete": complete,
    }


async def run_attempt(
    raw: object,
    *,
    node_id: str,
    data_dir: Path,
    link: OutputLink,
    attempts: RunningAttempts,
    heartbeat: Callable[[], None] = activity.heartbeat,
) -> dict[str, object]:
    """Run the attempt RAW describes (see the module's docstring); its result object."""
    spec = AttemptSpec.parse(raw, node_secrets(IdentityDir(data_dir), node_id))
    running = attempts.enter(spec)
    try:
        try:
            workdir = fresh_workdir(data_dir, spec)
        except OSError as e:
            raise ApplicationError(
                f"job {spec.job_id} attempt {spec.attempt}: cannot make its working directory "
                f"in {runtimes_dir(data_dir)}: {e.strerror or e}",
                type=NO_WORKDIR,
                non_retryable=True,
            ) from None
        try:
            return await _run(spec, workdir, data_dir, node_id, link, running, heartbeat)
        finally:
            remove_tree(workdir)
    finally:
        attempts.leave(running)


async def _run(
    spec: AttemptSpec,
    workdir: Path,
    data_dir: Path,
    node_id: str,
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
                    env = attempt_env(spec, node_id, data_dir)
                    child = await spawn(spec.command, cwd=workdir, env=env, on_output=relay.add)
                except OSError as e:
                    code = 127 if isinstance(e, FileNotFoundError) else 126
                    why = e.strerror or str(e)
                    relay.add(
                        "stderr", f"oz0-node: cannot run {spec.command[0]!r}: {why}\n".encode()
                    )
                    return _result(code, None, "exit", relay, await _finish(relay, spec, running))
                log.info(
                    "job %s attempt %d: started process %d", spec.job_id, spec.attempt, child.pid
                )
                try:
                    return await _supervise(spec, child, relay, running)
                finally:
                    # Whatever ended the attempt, nothing of it outlives it.
                    await _to_completion(child.end())
                    child.close()
            finally:
                ended.set()  # the heartbeats stop, and the group ends with them
                await relay.abandon()
    except* Exception as failed:
        _raise_the_one(failed)  # the heartbeats raise nothing: the attempt's own error


async def _supervise(
    spec: AttemptSpec, child: Child, relay: OutputRelay, running: Running
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
    elif members(child.pid):
        log.info(
            "job %s attempt %d: ending what the command left running",
            spec.job_id,
            spec.attempt,
        )
    await _to_completion(child.end())
    with contextlib.suppress(TimeoutError):
        # A pipe held by a process that left the group (setsid) is not waited for.
        await asyncio.wait_for(child.pipes_closed.wait(), DRAIN_TIMEOUT)
    complete = await _finish(relay, spec, running)
    code = child.returncode
    signal = -code if code is not None and code < 0 else None
    if timed_out:
        return _result(None, signal, "timeout", relay, complete)
    assert code is not None
    exit_code = 128 + signal if signal is not None else code
    return _result(exit_code, signal, "exit", relay, complete)


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
    node_id: str, data_dir: Path, link: OutputLink, attempts: RunningAttempts
) -> Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, object]]]:
    """The `oz0.job.attempt` activity of one runtime."""

    @activity.defn(name=ACTIVITY)
    async def attempt(raw: dict[str, Any]) -> dict[str, object]:
        return await run_attempt(
            raw, node_id=node_id, data_dir=data_dir, link=link, attempts=attempts
        )

    return attempt
