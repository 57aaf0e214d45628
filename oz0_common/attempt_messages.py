"""The attempt messages of the control stream, typed once for both ends (docs/node-protocol.md,
"Jobs" and "Attempts over the stream"): the edge builds what the node parses, and the node
builds what the edge parses, with the same classes, so the two cannot read one field two ways.

- `attempt` (edge → node): a streamed part's attempt message, as placed in its row
  (`AttemptSent`: the attempt's fields, which its grant signs, and the job's lost-after);
- `attempt_taken` (node → edge): what the node did with it (`AttemptTaken`, `Taken`);
- `attempt_done` (node → edge): how it ended (`AttemptDone`): its `AttemptResult` (the
  process's end, as Nomad's ProcessState: exit code, signal, why it ended, output and what
  limits applied), a `Failure` (type, message) or cancelled.

Parsing is the receiving side's: a malformed message raises BadAttemptMessage (one line,
for the log) and the stream goes on. The edge bounds what a node says (MAX_*).
"""

from __future__ import annotations

import enum
import json
import math
import re
from dataclasses import dataclass, field, replace
from typing import Any

ATTEMPT = "attempt"
TAKEN = "attempt_taken"
DONE = "attempt_done"
DONE_ACK = "attempt_done_ack"
ALIVE = "attempt_alive"
STOP = "attempt_stop"
MAX_JOBS = "max_jobs"
# What a node that takes attempts over its stream says in its max_jobs ("attempts").
BY_STREAM = "stream"

JOB_ID = re.compile(r"job-[0-9a-f]{12}\Z")
MAX_NUMBER = 2**31
# A result is a few numbers and flags; a failure one line.
MAX_RESULT = 16 * 1024
MAX_FAILURE_TYPE = 100
MAX_FAILURE_MESSAGE = 4 * 1024
# The lost-after a node uses for an attempt sent without a valid one, and the most it takes.
DEFAULT_LOST_AFTER = 15.0
MAX_LOST_AFTER = 7 * 86400.0


class BadAttemptMessage(ValueError):
    """A message that is not what its type says; the text says why, in one line."""


class Taken(enum.StrEnum):
    """A node's answer to an `attempt`."""

    STARTED = "started"  # its supervisor runs (answered only then)
    RUNS = "runs"  # it runs here already (sent again)
    WAITING = "waiting"  # it waits here for a slot (--max-jobs)
    RAN = "ran"  # this node ran it before and has it no more: not run twice
    REFUSED = "refused"  # its grant does not hold here
    FAILED = "failed"  # it could not start

    @property
    def has_it(self) -> bool:
        """Whether the node holds the attempt now (nothing more is sent or started)."""
        return self in (Taken.STARTED, Taken.RUNS, Taken.WAITING)


class EndedBecause(enum.StrEnum):
    """Why the process of an attempt ended, as its supervisor saw it."""

    EXIT = "exit"
    TIMEOUT = "timeout"
    STOPPED = "stopped"  # the node stopped it (cancelled, lost, the agent stopping)


def is_job_id(value: object) -> bool:
    return isinstance(value, str) and JOB_ID.fullmatch(value) is not None


def is_number(value: object) -> bool:
    """An attempt number: a whole number (not a bool) in 1..MAX_NUMBER-1."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < MAX_NUMBER


def _whole(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Failure:
    """Why an attempt did not run or did not end as a process: an error TYPE the workflow
    tells apart (AttemptRefused, SecretsUnreadable, ...) and a MESSAGE for people."""

    type: str
    message: str

    def to_wire(self) -> dict[str, str]:
        return {"type": self.type, "message": self.message}

    @classmethod
    def parse(cls, raw: object) -> Failure:
        kind = raw.get("type") if isinstance(raw, dict) else None
        text = raw.get("message") if isinstance(raw, dict) else None
        if not isinstance(kind, str) or not kind or len(kind) > MAX_FAILURE_TYPE:
            raise BadAttemptMessage("a failure has a type")
        if not isinstance(text, str) or len(text) > MAX_FAILURE_MESSAGE:
            raise BadAttemptMessage("a failure has a message")
        return cls(kind, text)


@dataclass(frozen=True)
class AttemptResult:
    """How an attempt's process ended (the supervisor's status file, then `attempt_done`'s
    "result"): read leniently, as the edge always has (a field missing or of another type
    is None or its default), since the workflow reads only ended_because, exit_code and
    applied of it."""

    exit_code: int | None
    signal: int | None = None
    ended_because: EndedBecause = EndedBecause.EXIT
    output_bytes: int = 0
    truncated: bool = False
    # What limits the node applied (oz0/jobs/limits.py checks it); None: it said nothing.
    applied: dict[str, Any] | None = None
    # False when the node dropped output it could not store (the agent's own record).
    output_complete: bool = True

    @property
    def timed_out(self) -> bool:
        return self.ended_because is EndedBecause.TIMEOUT

    def to_wire(self) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code,
            "signal": self.signal,
            "ended_because": str(self.ended_because),
            "output_bytes": self.output_bytes,
            "truncated": self.truncated,
            "applied": self.applied,
            "output_complete": self.output_complete,
        }

    @classmethod
    def parse(cls, raw: object) -> AttemptResult:
        if not isinstance(raw, dict):
            raise BadAttemptMessage("a result is an object")
        because = raw.get("ended_because")
        applied = raw.get("applied")
        return cls(
            exit_code=_whole(raw.get("exit_code")),
            signal=_whole(raw.get("signal")),
            # Anything but a timeout or a stop is the process's own exit, as it always was.
            ended_because=(
                EndedBecause(because)
                if because in (EndedBecause.TIMEOUT, EndedBecause.STOPPED)
                else EndedBecause.EXIT
            ),
            output_bytes=_whole(raw.get("output_bytes")) or 0,
            truncated=raw.get("truncated") is True,
            applied=applied if isinstance(applied, dict) else None,
            output_complete=raw.get("output_complete") is not False,
        )

    def with_output_complete(self, complete: bool) -> AttemptResult:
        return replace(self, output_complete=complete)


@dataclass(frozen=True)
class AttemptDone:
    """`attempt_done`: how attempt NUMBER of JOB ended on the node, exactly one of RESULT,
    FAILURE or CANCELLED."""

    job: str
    number: int
    result: AttemptResult | None = None
    failure: Failure | None = None
    cancelled: bool = False

    def __post_init__(self) -> None:
        given = (self.result is not None) + (self.failure is not None) + self.cancelled
        if given != 1:
            raise BadAttemptMessage("give one of result, failure or cancelled")

    def to_wire(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"job": self.job, "attempt": self.number}
        if self.result is not None:
            fields["result"] = self.result.to_wire()
        elif self.failure is not None:
            fields["failure"] = self.failure.to_wire()
        else:
            fields["cancelled"] = True
        return fields

    @classmethod
    def parse(cls, message: dict[str, Any]) -> AttemptDone:
        job, number = parse_ref(message)
        given = [k for k in ("result", "failure", "cancelled") if k in message]
        if len(given) != 1:
            raise BadAttemptMessage("give one of result, failure or cancelled")
        if "result" in message:
            raw = message["result"]
            if not isinstance(raw, dict) or len(json.dumps(raw)) > MAX_RESULT:
                raise BadAttemptMessage(f"a result is an object of at most {MAX_RESULT} bytes")
            return cls(job, number, result=AttemptResult.parse(raw))
        if "failure" in message:
            return cls(job, number, failure=Failure.parse(message["failure"]))
        if message["cancelled"] is not True:
            raise BadAttemptMessage("cancelled must be true")
        return cls(job, number, cancelled=True)


@dataclass(frozen=True)
class AttemptTaken:
    """`attempt_taken`: what the node did with attempt NUMBER of JOB, and why if it did not
    take it (FAILURE, for REFUSED and FAILED only)."""

    job: str
    number: int
    taken: Taken
    failure: Failure | None = None

    def __post_init__(self) -> None:
        needs = self.taken in (Taken.REFUSED, Taken.FAILED)
        if needs != (self.failure is not None):
            raise BadAttemptMessage(f"{self.taken} {'needs' if needs else 'takes no'} failure")

    def to_wire(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"job": self.job, "attempt": self.number, "taken": str(self.taken)}
        if self.failure is not None:
            fields["failure"] = self.failure.to_wire()
        return fields

    @classmethod
    def parse(cls, message: dict[str, Any]) -> AttemptTaken:
        job, number = parse_ref(message)
        try:
            taken = Taken(str(message.get("taken")))
        except ValueError:
            raise BadAttemptMessage("taken is not one of the answers") from None
        if not taken.has_it and taken is not Taken.RAN:
            # A node's text is bounded here, not refused for its length.
            raw = message.get("failure")
            if isinstance(raw, dict):
                kind, text = raw.get("type"), raw.get("message")
                raw = {
                    "type": kind[:MAX_FAILURE_TYPE] if isinstance(kind, str) else kind,
                    "message": text[:MAX_FAILURE_MESSAGE] if isinstance(text, str) else "",
                }
            return cls(job, number, taken, Failure.parse(raw))
        return cls(job, number, taken)


@dataclass(frozen=True)
class AttemptSent:
    """`attempt`: a streamed part as the edge sends it. ATTEMPT is the attempt's fields as
    its grant signs them (job_id, attempt, command, env, timeout, grant, limits?,
    secrets?), which the node checks before it runs anything (oz0_node/jobs/attempt.py);
    only JOB and NUMBER are read here. LOST_AFTER: the job's, how long the node may be cut
    off before the cluster moves the part."""

    attempt: dict[str, Any] = field(repr=False)
    lost_after: float

    @property
    def job(self) -> str:
        return str(self.attempt["job_id"])

    @property
    def number(self) -> int:
        return int(self.attempt["attempt"])

    def to_wire(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "lost_after": self.lost_after}

    @classmethod
    def parse(cls, message: dict[str, Any]) -> AttemptSent:
        raw, lost_after = message.get("attempt"), message.get("lost_after")
        if not isinstance(raw, dict):
            raise BadAttemptMessage("attempt is an object")
        if not is_job_id(raw.get("job_id")):
            raise BadAttemptMessage("no valid job ID")
        if not is_number(raw.get("attempt")):
            raise BadAttemptMessage("no valid attempt number")
        if (
            isinstance(lost_after, bool)
            or not isinstance(lost_after, int | float)
            or not math.isfinite(lost_after)
            or not 0 < lost_after <= MAX_LOST_AFTER
        ):
            lost_after = DEFAULT_LOST_AFTER
        return cls(raw, float(lost_after))


def parse_ref(message: dict[str, Any]) -> tuple[str, int]:
    """The job and attempt number a message names ("job", "attempt"), checked."""
    job, number = message.get("job"), message.get("attempt")
    if not is_job_id(job):
        raise BadAttemptMessage("no valid job ID")
    if not is_number(number):
        raise BadAttemptMessage("no valid attempt number")
    assert isinstance(job, str) and isinstance(number, int)
    return job, number
