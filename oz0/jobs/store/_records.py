"""A job and its attempts and parts as operators see them (`job show`, the API, the web UI),
and what the rows the other modules read are made into. No SQL."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any, TypedDict, cast

import psycopg

from oz0.jobs.spec import ENDED_STATES
from oz0.jobs.spec_text import DEFAULT_ON_LOST
from oz0.json_values import iso

Conn = psycopg.Connection[Any]


class AttemptJson(TypedDict):
    """An attempt as the API answers it (times in ISO 8601)."""

    number: int
    part: int
    node: str
    state: str
    started_at: str
    ended_at: str | None
    exit_code: int | None
    ended_because: str | None
    output_bytes: int
    truncated: bool
    applied: dict[str, Any] | None
    # The node's words on why it failed the attempt (ended_because names what that was).
    ended_detail: str | None


class BatchJson(TypedDict):
    size: str
    wait: float
    max_failures: str | None


class PartsJson(TypedDict):
    """How many parts of an --all job are where."""

    total: int
    waiting: int
    running: int
    ended: int
    not_started: int
    waiting_nodes: list[str]


class JobFileJson(TypedDict):
    sha256: str
    size: int
    name: str


class JobJson(TypedDict):
    """A job as the API answers it (`job show`)."""

    id: str
    name: str | None
    tenant: str
    state: str
    reason: str | None
    command: list[str]
    selector: dict[str, str]
    node: str | None
    all: bool
    retries: int
    timeout: float | None
    queue_timeout: float
    no_move: bool
    # The names only: values may be secrets.
    env: list[str]
    secret_env: list[str]
    exit_code: int | None
    created_at: str
    started_at: str | None
    ended_at: str | None
    created_by: str
    limits: dict[str, int | float]
    on_lost: str
    lost_after: float | None
    batch: BatchJson | None
    parts: PartsJson | None
    schedule: str | None
    files: list[JobFileJson]
    attempts: list[AttemptJson]


@dataclass(frozen=True)
class Attempt:
    number: int
    part: int
    node: str
    state: str
    started_at: dt.datetime
    ended_at: dt.datetime | None
    exit_code: int | None
    ended_because: str | None
    output_bytes: int
    truncated: bool
    # What the node said it applied (limits.py); None: it said nothing.
    applied: dict[str, Any] | None = None
    # The node's words on why it failed the attempt (ended_because names what that was).
    ended_detail: str | None = None

    def to_json(self) -> AttemptJson:
        return {
            "number": self.number,
            "part": self.part,
            "node": self.node,
            "state": self.state,
            "started_at": self.started_at.isoformat(),
            "ended_at": iso(self.ended_at),
            "exit_code": self.exit_code,
            "ended_because": self.ended_because,
            "output_bytes": self.output_bytes,
            "truncated": self.truncated,
            "applied": self.applied,
            "ended_detail": self.ended_detail,
        }


@dataclass(frozen=True)
class Part:
    """A rolling batch's part (job_parts): its node, chosen as the job started, and whether
    it waits for a slot, was placed (its attempts tell the rest) or was never started."""

    part: int
    node: str
    state: str
    because: str | None


# A part of an --all job as `job show` counts it.
WAITING, RUNNING_PART, ENDED_PART, NOT_STARTED = "waiting", "running", "ended", "not started"


@dataclass(frozen=True)
class Job:
    id: str
    tenant: str
    name: str | None
    command: list[str]
    selector: dict[str, str]
    node: str | None
    all_nodes: bool
    env: dict[str, str]
    timeout: float | None
    queue_timeout: float
    retries: int
    no_move: bool
    state: str
    reason: str | None
    exit_code: int | None
    created_by: str
    created_at: dt.datetime
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    limits: dict[str, int | float]
    # The names of its secret environment; the values are in job_secrets (secret_env.py).
    secret_env: list[str] = field(default_factory=list)
    # What its attempt does when its node is lost, and after how long (None: the default
    # for on_lost, spec_text.LOST_AFTER).
    on_lost: str = DEFAULT_ON_LOST
    lost_after: float | None = None
    # Its rolling batch (spec.JobSpec): None, every part at once.
    batch: str | None = None
    batch_wait: float = 0.0
    max_failures: str | None = None
    # The schedule whose run made it (schedules.py), if one did.
    schedule_id: str | None = None
    # An operator asked for its cancellation (its workflow may not have heard yet).
    cancel_requested: bool = False
    # Its workflow was started streaming its attempts (parts.py, JobInput.streamed).
    streamed: bool = False
    # Files placed in each attempt's working directory (`job run --file`): [{"sha256",
    # "size", "name"}], signed with the attempt.
    files: list[dict[str, Any]] = field(default_factory=list)
    attempts: tuple[Attempt, ...] = ()
    # A batch job's parts (job_parts); other jobs have none.
    parts: tuple[Part, ...] = ()

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES

    def part_states(self) -> dict[int, str]:
        """Each part of an --all job by number: WAITING, RUNNING_PART, ENDED_PART or
        NOT_STARTED; a part that was placed is where its last attempt is."""
        states = {p.part: p.state for p in self.parts if p.state != "placed"}
        for attempt in self.attempts:  # in order of number: the last one wins
            states[attempt.part] = RUNNING_PART if attempt.state == "running" else ENDED_PART
        return states

    def parts_json(self) -> PartsJson | None:
        """How many parts of an --all job wait, run, have ended or were never started,
        and which nodes wait; None for a job on one node."""
        if not self.all_nodes:
            return None
        states = self.part_states()
        counts = {k: sum(1 for s in states.values() if s == k) for k in _PART_KEYS}
        waiting = [p.node for p in self.parts if states.get(p.part) == WAITING]
        return {
            "total": len(states),
            "waiting": counts[WAITING],
            "running": counts[RUNNING_PART],
            "ended": counts[ENDED_PART],
            "not_started": counts[NOT_STARTED],
            "waiting_nodes": waiting,
        }

    def to_json(self) -> JobJson:
        return {
            "id": self.id,
            "name": self.name,
            "tenant": self.tenant,
            "state": self.state,
            "reason": self.reason,
            "command": self.command,
            "selector": self.selector,
            "node": self.node,
            "all": self.all_nodes,
            "retries": self.retries,
            "timeout": self.timeout,
            "queue_timeout": self.queue_timeout,
            "no_move": self.no_move,
            # Values may be secrets of the operator's: they are kept to run the job, not shown.
            "env": sorted(self.env),
            "secret_env": sorted(self.secret_env),
            "exit_code": self.exit_code,
            "created_at": self.created_at.isoformat(),
            "started_at": iso(self.started_at),
            "ended_at": iso(self.ended_at),
            "created_by": self.created_by,
            "limits": self.limits,
            "on_lost": self.on_lost,
            "lost_after": self.lost_after,
            "batch": None
            if self.batch is None
            else {"size": self.batch, "wait": self.batch_wait, "max_failures": self.max_failures},
            "parts": self.parts_json(),
            "schedule": self.schedule_id,
            "files": cast(list[JobFileJson], self.files),
            "attempts": [a.to_json() for a in self.attempts],
        }


_PART_KEYS = {
    WAITING: "waiting", RUNNING_PART: "running", ENDED_PART: "ended", NOT_STARTED: "not_started",
}  # fmt: skip
