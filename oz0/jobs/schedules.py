"""Schedules: a job run again and again by a Temporal Schedule in its tenant's namespace.

Temporal holds when a schedule runs (its cron expression or interval, time zone, overlap
policy, catch-up window), whether it is paused, and its next times (schedule_calls.py);
this module holds what it runs and who made it: one row per schedule (`schedules`), what
`schedule list` reads with the operator's tenant scope, and what each run reads its job
from. A run is an ordinary job (`start_run`): made by the run's workflow
(scheduled.py) in one idempotent step, created by the schedule's owner (its maker, or whom
an admin gave it to: schedule_owners.py) and audited as started by `schedule:<id>`.
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
import zoneinfo
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict

from psycopg.types.json import Jsonb

from oz0 import audit, listing
from oz0.errors import Oz0Error
from oz0.jobs import schedule_owners, store
from oz0.jobs.spec import JobBody, JobError, JobSpec

# As `--overlap` names them (Temporal's ScheduleOverlapPolicy: SKIP, BUFFER_ONE, ALLOW_ALL,
# CANCEL_OTHER): what a run due while the last one still runs does.
OVERLAPS = ("skip", "buffer-one", "allow", "cancel-other")
DEFAULT_OVERLAP = "skip"
# Temporal's own bounds: an interval of at least a second; a catch-up window of at least 10 s.
MIN_EVERY, MAX_EVERY = 1.0, 366 * 24 * 3600.0
DEFAULT_CATCHUP, MIN_CATCHUP, MAX_CATCHUP = 60.0, 10.0, 366 * 24 * 3600.0
MAX_CRON = 256
MAX_LIST = 1000
_SCHEDULE_ID = re.compile(r"^sched-[0-9a-f]{12}$")
# A cron expression as Temporal reads one: 5 to 7 fields of these characters, or a
# predefined one (@daily, @every 5m); Temporal checks the rest and says why.
_CRON = re.compile(r"^(@[a-z]+( [0-9a-z]+)?|[0-9A-Za-z*/,?#L\-]+( [0-9A-Za-z*/,?#L\-]+){4,6})$")


class ScheduleBody(TypedDict, total=False):
    """`POST /api/v1/schedules`'s body (ScheduleSpec.from_json checks it): cron or every."""

    job: Required[JobBody]
    cron: str
    # Seconds between runs.
    every: float
    timezone: str | None
    overlap: Literal["skip", "buffer-one", "allow", "cancel-other"]
    pause_on_failure: bool
    catchup_window: float


_FIELDS = ScheduleBody.__required_keys__ | ScheduleBody.__optional_keys__


class ScheduleError(Oz0Error):
    """A schedule that cannot be made or changed as asked: the message says why."""


class ScheduleNotFound(ScheduleError):
    pass


def new_schedule_id() -> str:
    return "sched-" + secrets.token_hex(6)


def is_schedule_id(text: str) -> bool:
    return _SCHEDULE_ID.fullmatch(text) is not None


@dataclass(frozen=True)
class ScheduleSpec:
    """When a schedule runs and what: `schedule create`'s body, checked."""

    job: JobSpec
    # The job as the API took it (checked by JobSpec): what the row keeps, each run's job.
    job_json: dict[str, Any]
    cron: str | None = None
    every: float | None = None
    timezone: str | None = None
    overlap: str = DEFAULT_OVERLAP
    pause_on_failure: bool = False
    catchup_window: float = DEFAULT_CATCHUP

    @property
    def tenant(self) -> str:
        return self.job.tenant

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> ScheduleSpec:
        unknown = set(body) - _FIELDS
        if unknown:
            raise ScheduleError(f"unknown field {sorted(unknown)[0]!r} in the schedule")
        job_json = body.get("job")
        if not isinstance(job_json, dict):
            raise ScheduleError("job must be an object: the job each run starts")
        if job_json.get("secret_env"):
            # Sealed per job and deleted at its end (secret_env.py): a schedule has no
            # place to keep them between runs.
            raise ScheduleError("a schedule cannot carry secrets (secret_env)")
        try:
            job = JobSpec.from_json(job_json)
        except JobError as e:
            raise ScheduleError(str(e)) from None
        cron, every = body.get("cron"), body.get("every")
        if (cron is None) == (every is None):
            raise ScheduleError("give either cron or every (how often it runs), not both")
        return cls(
            job=job,
            job_json=dict(job_json),
            cron=None if cron is None else _cron(cron),
            every=None if every is None else _seconds(every, "every", MIN_EVERY, MAX_EVERY),
            timezone=_timezone(body.get("timezone")),
            overlap=_choice(body.get("overlap", DEFAULT_OVERLAP)),
            pause_on_failure=_flag(body.get("pause_on_failure", False)),
            catchup_window=_seconds(
                body.get("catchup_window", DEFAULT_CATCHUP), "catchup_window",
                MIN_CATCHUP, MAX_CATCHUP,
            ),
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {
            "cron": self.cron,
            "every": self.every,
            "timezone": self.timezone,
            "overlap": self.overlap,
            "pause_on_failure": self.pause_on_failure,
            "catchup_window": self.catchup_window,
            "job": self.job_json,
        }

    def when(self) -> str:
        """`cron '0 3 * * *' (Europe/Paris)`, `every 5s`, `every 1h` (as `--every` takes
        it, in the largest unit that divides it: not `every 3600s`)."""
        if self.every is not None:
            for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
                if self.every >= size and self.every % size == 0:
                    return f"every {self.every / size:g}{unit}"
            return f"every {self.every:g}s"
        return f"cron '{self.cron}' ({self.timezone or 'UTC'})"


def _cron(value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_CRON:
        raise ScheduleError(f"cron must be a cron expression of at most {MAX_CRON} characters")
    text = " ".join(value.split())
    if not _CRON.fullmatch(text):
        raise ScheduleError(
            f"invalid cron expression {value!r}: give 5 fields (minute hour day-of-month"
            " month day-of-week), such as '*/5 * * * *', or @hourly, @daily, @weekly"
        )
    return text


def _timezone(value: object) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ScheduleError("timezone must be a time zone's name, such as Europe/Paris")
    try:
        zoneinfo.ZoneInfo(value)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            f"unknown time zone {value!r}: give an IANA name, such as Europe/Paris or UTC"
        ) from None
    return value


def _choice(value: object) -> str:
    if not isinstance(value, str) or value not in OVERLAPS:
        raise ScheduleError(f"overlap must be one of {', '.join(OVERLAPS)}")
    return value


def _flag(value: object) -> bool:
    if not isinstance(value, bool):
        raise ScheduleError("pause_on_failure must be true or false")
    return value


def _seconds(value: object, key: str, low: float, high: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise ScheduleError(f"{key} must be a number of seconds from {low:g} to {high:g}")
    return float(value)


class ScheduleJson(TypedDict):
    """A schedule's row as the API answers it (its state in Temporal is added by the API)."""

    id: str
    tenant: str
    cron: str | None
    every: float | None
    timezone: str | None
    overlap: str
    pause_on_failure: bool
    catchup_window: float
    when: str
    command: list[str]
    # The job each run starts, as `job run` takes one (env by its names only).
    job: dict[str, Any]
    created_by: str
    created_at: str
    owner: str
    paused_reason: str | None


@dataclass(frozen=True)
class Schedule:
    id: str
    tenant: str
    spec: ScheduleSpec
    created_by: str
    created_at: dt.datetime
    # Whose name its runs start jobs in, once an admin gave it to someone (None: its
    # creator's), and why it is paused until an admin does (schedule_owners.py).
    owner: str | None = None
    paused_reason: str | None = None

    @property
    def runs_as(self) -> str:
        return self.owner or self.created_by

    def to_json(self) -> dict[str, Any]:
        job = self.spec.job_json
        return {
            "id": self.id,
            "tenant": self.tenant,
            **{k: v for k, v in self.spec.to_json().items() if k != "job"},
            "when": self.spec.when(),
            "command": job["command"],
            # The job as `job show` shows one: env by its names only.
            "job": {**job, "env": sorted(job.get("env") or {})},
            "created_by": self.created_by,
            "created_at": self.created_at.isoformat(),
            "owner": self.runs_as,
            "paused_reason": self.paused_reason,
        }


_COLUMNS = "id, tenant, spec, created_by, created_at, owner, paused_reason"


def _schedule(row: tuple[Any, ...]) -> Schedule:
    schedule_id, tenant, spec, created_by, created_at, owner, paused_reason = row
    return Schedule(
        schedule_id, tenant, ScheduleSpec.from_json(spec), created_by, created_at, owner,
        paused_reason,
    )  # fmt: skip


def create(conn: store.Conn, schedule_id: str, spec: ScheduleSpec, actor: audit.Actor) -> Schedule:
    """The schedule's row and its `schedule.create` audit row (its Temporal Schedule is
    made first, schedule_calls.create)."""
    if conn.execute("SELECT 1 FROM tenants WHERE name = %s", (spec.tenant,)).fetchone() is None:
        raise ScheduleNotFound(f"tenant {spec.tenant} not found")
    conn.execute(
        "INSERT INTO schedules (id, tenant, spec, created_by) VALUES (%s, %s, %s, %s)",
        (schedule_id, spec.tenant, Jsonb(spec.to_json()), f"{actor.kind}:{actor.name}"),
    )
    audit.record(
        conn,
        actor,
        "schedule.create",
        f"schedule:{schedule_id}",
        {"tenant": spec.tenant, "when": spec.when(), "overlap": spec.overlap,
         "command": spec.job.command},
        tenants=[spec.tenant],
    )  # fmt: skip
    return get(conn, schedule_id)


def get(conn: store.Conn, schedule_id: str, *, scope: listing.Scope = None) -> Schedule:
    """The schedule SCHEDULE_ID; ScheduleNotFound if none in SCOPE's tenants (None: any),
    the same answer for another tenant's as for an unknown ID."""
    where = listing.Where().also("id = %(id)s", id=schedule_id).within("tenant", scope)
    row = conn.execute(f"SELECT {_COLUMNS} FROM schedules" + where.sql, where.params).fetchone()
    if row is None:
        raise ScheduleNotFound(f"schedule {schedule_id} not found")
    return _schedule(row)


def list_schedules(
    conn: store.Conn, *, tenant: str | None = None, limit: int = 100, scope: listing.Scope = None
) -> list[Schedule]:
    """The newest schedules first, of TENANT if given, of SCOPE's tenants (None: all)."""
    where = listing.Where().equal("tenant", tenant).within("tenant", scope)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM schedules" + where.sql
        + " ORDER BY created_at DESC, id LIMIT %(limit)s",
        {**where.params, "limit": max(1, min(limit, MAX_LIST))},
    ).fetchall()  # fmt: skip
    return [_schedule(r) for r in rows]


def record(conn: store.Conn, actor: audit.Actor, action: str, schedule: Schedule) -> None:
    """The audit row of ACTION ("schedule.pause", ...) done to SCHEDULE."""
    audit.record(
        conn, actor, action, f"schedule:{schedule.id}", {"tenant": schedule.tenant},
        tenants=[schedule.tenant],
    )  # fmt: skip


def delete(conn: store.Conn, schedule: Schedule, actor: audit.Actor) -> None:
    """Forget SCHEDULE (its Temporal Schedule is deleted first); its jobs stay, and still
    name it (`job list --schedule`)."""
    conn.execute("DELETE FROM schedules WHERE id = %s", (schedule.id,))
    record(conn, actor, "schedule.delete", schedule)


def start_run(
    conn: store.Conn, schedule_id: str, run_key: str, keeper: Any = None
) -> store.Job | schedule_owners.Held | None:
    """The job of the run RUN_KEY (its workflow's ID and run ID) of SCHEDULE_ID: made now,
    or the one made when this step ran before, so a step run twice makes one job. None if
    the schedule is gone (deleted while its run was due); Held if it is paused until an
    admin takes it over, or must be now (its owner may no longer run it). The job's
    workflow is the run's child, so the job is made started: no sweeper starts it
    (store.claim_unstarted)."""
    made = conn.execute("SELECT id FROM jobs WHERE run_key = %s", (run_key,)).fetchone()
    if made is not None:
        return store.get(conn, str(made[0]))
    try:
        schedule = get(conn, schedule_id)
    except ScheduleNotFound:
        return None
    held = schedule_owners.check_run(
        conn, schedule.id, schedule.tenant, schedule.runs_as,
        creator=schedule.owner is None, paused_reason=schedule.paused_reason,
    )  # fmt: skip
    if held is not None:
        return held
    run = store.ScheduledRun(schedule.id, run_key, schedule.runs_as)
    return store.create(
        conn, schedule.spec.job, audit.Actor("schedule", schedule.id), keeper, run=run
    )
