"""POST/GET /api/v1/schedules, GET /api/v1/schedules/<id>, POST .../pause, .../unpause,
.../trigger, PATCH (an admin gives it to a new owner) and DELETE /api/v1/schedules/<id>.

A schedule is a row (oz0/jobs/schedules.py) and a Temporal Schedule in its tenant's
namespace (oz0/jobs/schedule_calls.py), reached through this server's job role. The
functions below do each operation for the API and the web UI's Schedules page alike, and
raise ApiError with the status and the one line to show.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypedDict, TypeVar

import trio
from quart import Response, jsonify, request
from quart_trio import QuartTrio
from temporalio.client import Client
from temporalio.service import RPCError

from oz0 import access, tenant_caps
from oz0.cap_rules import CapReached, TenantCaps
from oz0.jobs import schedule_calls, schedule_owners, schedules, store
from oz0.jobs.schedule_calls import TimingJson
from oz0.jobs.schedule_owners import Held
from oz0.jobs.schedules import (
    Schedule,
    ScheduleBody,
    ScheduleError,
    ScheduleJson,
    ScheduleNotFound,
    ScheduleSpec,
)
from oz0.jobs.spec import JobError
from oz0.jobs.worker_loop import JobsUnavailable
from oz0.json_values import iso
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described

log = logging.getLogger(__name__)

T = TypeVar("T")
# The runs `schedule show` lists, newest first.
SHOWN_RUNS = 10
TEMPORAL_UNAVAILABLE = "Temporal cannot be reached from this server now; try again shortly"
# How long a removal or demotion waits for the pauses of the schedules it paused in
# Temporal (their rows are paused already: their runs start nothing meanwhile).
PAUSE_HELD_WITHIN = 5.0
_SCHEDULE_ID = {"schedule_id": {"type": "string", "pattern": "^sched-[0-9a-f]{12}$"}}
_REFUSED = {
    404: "no such schedule (or another tenant's)",
    409: "paused until an admin takes it over",
    503: "Temporal cannot be reached from this server now",
}


class Timed(ScheduleJson):
    """A schedule and its state in Temporal (`temporal` null: Temporal was not reached)."""

    temporal: TimingJson | None
    paused: bool | None
    next_times: list[str]


class Run(TypedDict):
    id: str
    state: str
    exit_code: int | None
    reason: str | None
    created_at: str
    ended_at: str | None


class Shown(Timed):
    # Its newest runs.
    runs: list[Run]


class Deleted(ScheduleJson):
    deleted: bool


class ScheduleQuery(TypedDict, total=False):
    tenant: str


class Schedules(TypedDict):
    schedules: list[Timed]


class NewOwner(TypedDict):
    owner: str


class GivenAway(Timed):
    previous_owner: str
    resumed: bool


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.post("/api/v1/schedules")
    @described("Make a schedule", body=ScheduleBody, answers={201: Timed}, errors=_REFUSED)
    async def schedule_create() -> tuple[Response, int]:
        made = await create(state, await operator(state), await json_object())
        return jsonify(made), 201

    @app.get("/api/v1/schedules")
    @described("Schedules", query=ScheduleQuery, answers={200: Schedules})
    async def schedule_list() -> Response:
        scope = (await operator(state)).scope
        found = await listing(state, scope, tenant=request.args.get("tenant"))
        return jsonify({"schedules": found})

    @app.get("/api/v1/schedules/<schedule_id>")
    @described(
        "A schedule and its newest runs", answers={200: Shown}, path=_SCHEDULE_ID,
        errors=_REFUSED,
    )  # fmt: skip
    async def schedule_show(schedule_id: str) -> Response:
        return jsonify(await show(state, (await operator(state)).scope, schedule_id))

    @app.post("/api/v1/schedules/<schedule_id>/pause")
    @described("Pause a schedule", answers={200: Timed}, path=_SCHEDULE_ID, errors=_REFUSED)
    async def schedule_pause(schedule_id: str) -> Response:
        return jsonify(await act(state, await operator(state), schedule_id, "pause"))

    @app.post("/api/v1/schedules/<schedule_id>/unpause")
    @described("Unpause a schedule", answers={200: Timed}, path=_SCHEDULE_ID, errors=_REFUSED)
    async def schedule_unpause(schedule_id: str) -> Response:
        return jsonify(await act(state, await operator(state), schedule_id, "unpause"))

    @app.post("/api/v1/schedules/<schedule_id>/trigger")
    @described(
        "Start a schedule's run now", answers={200: Timed}, path=_SCHEDULE_ID, errors=_REFUSED
    )
    async def schedule_trigger(schedule_id: str) -> Response:
        return jsonify(await act(state, await operator(state), schedule_id, "trigger"))

    @app.patch("/api/v1/schedules/<schedule_id>")
    @described(
        "Give a schedule to another person", body=NewOwner, answers={200: GivenAway},
        path=_SCHEDULE_ID, errors=_REFUSED,
    )  # fmt: skip
    async def schedule_set(schedule_id: str) -> Response:
        body = await json_object()
        owner = body.get("owner")
        if set(body) != {"owner"} or not isinstance(owner, str):
            raise ApiError(400, "body must be a JSON object with the new `owner` (a name)")
        return jsonify(await set_owner(state, await operator(state), schedule_id, owner))

    @app.delete("/api/v1/schedules/<schedule_id>")
    @described("Delete a schedule", answers={200: Deleted}, path=_SCHEDULE_ID, errors=_REFUSED)
    async def schedule_delete(schedule_id: str) -> Response:
        return jsonify(await act(state, await operator(state), schedule_id, "delete"))


async def create(
    state: ManagementState, person: access.Person, body: dict[str, Any]
) -> dict[str, Any]:
    """Make a schedule: its Temporal Schedule first (Temporal checks the cron expression
    and the time zone), then its row. A row that cannot be written deletes the Temporal
    Schedule again; a server that dies between the two leaves a Temporal Schedule whose
    runs find no row and start nothing (schedules.start_run)."""
    try:
        spec = ScheduleSpec.from_json(body)
    except ScheduleError as e:
        raise ApiError(400, str(e)) from None
    _check(person, "create schedules", spec.tenant)
    await _db(state, lambda conn: _tenant_exists(conn, spec.tenant))
    # The tenant's caps (oz0/tenant_caps.py) before Temporal is asked, and again with the row.
    await _db(state, lambda conn: _room(conn, spec))
    schedule_id = schedules.new_schedule_id()
    await _temporal(state, spec.tenant, lambda c: schedule_calls.create(c, schedule_id, spec))
    try:
        timing = await _temporal(
            state, spec.tenant, lambda c: schedule_calls.describe(c, schedule_id)
        )

        def made_within_caps(conn: store.Conn) -> Schedule:
            caps = _room(conn, spec)
            if spec.cron is not None and caps is not None:
                # A cron expression's runs as Temporal works them out: the next five.
                tenant_caps.check_runs(spec.tenant, spec.when(), timing.next_times, caps)
            return schedules.create(conn, schedule_id, spec, person)

        made = await _db(state, made_within_caps)
    except Exception:
        try:
            await _temporal(state, spec.tenant, lambda c: schedule_calls.delete(c, schedule_id))
        except ApiError as e:  # its runs find no row and start nothing
            log.warning("schedule %s: its Temporal Schedule is left: %s", schedule_id, e)
        raise
    return {**made.to_json(), **_timing_json(timing, made)}


def _room(conn: store.Conn, spec: ScheduleSpec) -> TenantCaps | None:
    return tenant_caps.room_for_schedule(conn, spec.tenant, when=spec.when(), every=spec.every)


async def listing(
    state: ManagementState, scope: tuple[str, ...] | None, *, tenant: str | None = None
) -> list[dict[str, Any]]:
    """The schedules in SCOPE (of TENANT if given), newest first, each with its state in
    Temporal (asked for all at once)."""
    found = await _db(
        state, lambda conn: schedules.list_schedules(conn, tenant=tenant, scope=scope)
    )
    timings = await _timings(state, found)
    return [{**s.to_json(), **_timing_json(timings.get(s.id), s)} for s in found]


async def show(
    state: ManagementState, scope: tuple[str, ...] | None, schedule_id: str
) -> dict[str, Any]:
    """The schedule, its state and next times in Temporal, and its last runs (its jobs)."""
    _check_id(schedule_id)

    def read(conn: store.Conn) -> tuple[Schedule, list[store.Job]]:
        schedule = schedules.get(conn, schedule_id, scope=scope)
        runs = store.list_jobs(conn, schedule=schedule_id, limit=SHOWN_RUNS, scope=scope)
        return schedule, runs

    schedule, runs = await _db(state, read)
    timing = await _timing(state, schedule)
    return {
        **schedule.to_json(),
        **_timing_json(timing, schedule),
        "runs": [_run_json(j) for j in runs],
    }


async def act(
    state: ManagementState, person: access.Person, schedule_id: str, action: str
) -> dict[str, Any]:
    """Pause, unpause, trigger or delete a schedule of the person's tenants; audited."""
    _check_id(schedule_id)
    schedule = await _db(state, lambda conn: schedules.get(conn, schedule_id, scope=person.scope))
    _check(person, f"{action} schedules", schedule.tenant)
    if schedule.paused_reason is not None and action in ("unpause", "trigger"):
        raise ApiError(
            409,
            f"schedule {schedule_id} is paused: {schedule.paused_reason}; an admin takes it"
            f" over first (schedule set {schedule_id} --owner NAME)",
        )
    note = f"{action}d by {person.kind}:{person.name}"
    calls: dict[str, Callable[[Client], Awaitable[None]]] = {
        "pause": lambda c: schedule_calls.pause(c, schedule_id, note),
        "unpause": lambda c: schedule_calls.unpause(c, schedule_id, note),
        "trigger": lambda c: schedule_calls.trigger(c, schedule_id),
        "delete": lambda c: schedule_calls.delete(c, schedule_id),
    }
    try:
        await _temporal(state, schedule.tenant, calls[action])
    except ApiError as e:
        if e.status != 404 or action != "delete":
            raise
    actor = person.actor
    if action == "delete":
        await _db(state, lambda conn: schedules.delete(conn, schedule, actor))
        return {**schedule.to_json(), "deleted": True}
    await _db(state, lambda conn: schedules.record(conn, actor, f"schedule.{action}", schedule))
    return {**schedule.to_json(), **_timing_json(await _timing(state, schedule), schedule)}


async def set_owner(
    state: ManagementState, person: access.Person, schedule_id: str, owner: str
) -> dict[str, Any]:
    """Give a schedule to OWNER (an admin of its tenant only; OWNER must be allowed to run
    it); one paused because its owner left is resumed, in its row and then in Temporal.
    Audited `schedule.owner`."""
    _check_id(schedule_id)

    def give(conn: store.Conn) -> tuple[Schedule, schedule_owners.TakenOver]:
        schedule = schedules.get(conn, schedule_id, scope=person.scope)
        return schedule, schedule_owners.take_over(
            conn, person, schedule_id, schedule.tenant, owner
        )

    try:
        schedule, taken = await _db(state, give)
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None
    except schedule_owners.OwnerRefused as e:
        raise ApiError(400, str(e)) from None
    if taken.resumed:
        # The row first: were Temporal unpaused before, a run due in between would find
        # the row still paused and pause the schedule again.
        note = f"resumed: {person.kind}:{person.name} gave it to {taken.now}"
        try:
            await _temporal(
                state, schedule.tenant, lambda c: schedule_calls.unpause(c, schedule_id, note)
            )
        except ApiError as e:
            raise ApiError(
                e.status,
                f"schedule {schedule_id} is {owner}'s now, but its Temporal Schedule is still"
                f" paused: {e.message}; resume it with `schedule unpause {schedule_id}`",
            ) from None
    again = await _db(state, lambda conn: schedules.get(conn, schedule_id))
    return {
        **again.to_json(),
        **_timing_json(await _timing(state, again), again),
        "previous_owner": taken.was,
        "resumed": taken.resumed,
    }


async def pause_held(state: ManagementState, held: list[Held]) -> list[str]:
    """Pause in Temporal the schedules HELD (their rows paused already, by a removal or a
    demotion), all at once, within PAUSE_HELD_WITHIN; the IDs it could not pause (logged:
    each one's next run starts nothing and pauses it then)."""
    paused: set[str] = set()

    async def pause(one: Held) -> None:
        try:
            await _temporal(
                state, one.tenant, lambda c: schedule_calls.pause(c, one.schedule_id, one.note)
            )
        except ApiError as e:
            log.warning("schedule %s: could not pause it in Temporal: %s", one.schedule_id, e)
        else:
            paused.add(one.schedule_id)

    with trio.move_on_after(PAUSE_HELD_WITHIN) as waited:
        async with trio.open_nursery() as nursery:
            for one in held:
                nursery.start_soon(pause, one)
    if waited.cancelled_caught:
        log.warning("pausing %d schedules in Temporal took over %s s", len(held), PAUSE_HELD_WITHIN)
    return [h.schedule_id for h in held if h.schedule_id not in paused]


def _run_json(job: store.Job) -> dict[str, Any]:
    return {
        "id": job.id,
        "state": job.state,
        "exit_code": job.exit_code,
        "reason": job.reason,
        "created_at": job.created_at.isoformat(),
        "ended_at": iso(job.ended_at),
    }


def _timing_json(timing: schedule_calls.Timing | None, schedule: Schedule) -> dict[str, Any]:
    """The schedule's state in Temporal; `temporal` null when Temporal could not be asked.
    One paused until an admin takes it over is paused, with no next times, whatever
    Temporal says (its runs start nothing)."""
    if schedule.paused_reason is not None:
        return {
            "temporal": None if timing is None else timing.to_json(),
            "paused": True,
            "next_times": [],
        }
    if timing is None:
        return {"temporal": None, "paused": None, "next_times": []}
    return {
        "temporal": timing.to_json(),
        "paused": timing.paused if timing.found else None,
        "next_times": [t.isoformat() for t in timing.next_times],
    }


async def _timing(state: ManagementState, schedule: Schedule) -> schedule_calls.Timing | None:
    try:
        return await _temporal(
            state, schedule.tenant, lambda c: schedule_calls.describe(c, schedule.id)
        )
    except ApiError:
        return None  # the listing says Temporal could not be asked


async def _timings(
    state: ManagementState, found: list[Schedule]
) -> dict[str, schedule_calls.Timing]:
    """Each schedule's timing, asked together, per tenant; those not answered are left out."""
    by_tenant: dict[str, list[str]] = {}
    for s in found:
        by_tenant.setdefault(s.tenant, []).append(s.id)
    timings: dict[str, schedule_calls.Timing] = {}
    for tenant, ids in by_tenant.items():

        async def describe_all(client: Client, ids: list[str] = ids) -> list[Any]:
            return await asyncio.gather(
                *(schedule_calls.describe(client, i) for i in ids), return_exceptions=True
            )

        try:
            answers = await _temporal(state, tenant, describe_all)
        except ApiError:
            continue
        timings.update(
            (i, a) for i, a in zip(ids, answers, strict=True)
            if isinstance(a, schedule_calls.Timing)
        )  # fmt: skip
    return timings


def _tenant_exists(conn: store.Conn, tenant: str) -> None:
    if conn.execute("SELECT 1 FROM tenants WHERE name = %s", (tenant,)).fetchone() is None:
        raise ScheduleNotFound(f"tenant {tenant} not found")


def _check(person: access.Person, doing: str, tenant: str) -> None:
    try:
        person.check(access.Right.OPERATE, doing, tenant=tenant)
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None


def _check_id(schedule_id: str) -> None:
    if not schedules.is_schedule_id(schedule_id):
        raise ApiError(
            400, f"invalid schedule ID {schedule_id!r}: schedule IDs look like sched-0123456789ab"
        )


async def _db(state: ManagementState, work: Callable[[store.Conn], T]) -> T:
    try:
        return await state.db.transaction(work)
    except CapReached as e:
        raise ApiError(e.status, str(e)) from None
    except ScheduleNotFound as e:
        raise ApiError(404, str(e)) from None
    except (ScheduleError, JobError) as e:
        raise ApiError(400, str(e)) from None


async def _temporal(
    state: ManagementState, tenant: str, make: Callable[[Client], Awaitable[T]]
) -> T:
    """MAKE(a client of TENANT's namespace) on this server's Temporal connection."""
    if state.in_namespace is None:
        raise ApiError(503, TEMPORAL_UNAVAILABLE)
    try:
        return await state.in_namespace(tenant, make, schedule_calls.CALL_WITHIN)
    except ScheduleError as e:
        raise ApiError(400, str(e)) from None
    except RPCError as e:
        if e.status.name == "NOT_FOUND":
            raise ApiError(404, f"Temporal has no such schedule: {e.message}") from None
        log.warning("a schedule's Temporal call failed: %s", e)
        raise ApiError(503, TEMPORAL_UNAVAILABLE) from None
    except (JobsUnavailable, TimeoutError) as e:  # not connected, stopping, too slow
        log.warning("a schedule's Temporal call failed: %r", e)
        raise ApiError(503, TEMPORAL_UNAVAILABLE) from None
