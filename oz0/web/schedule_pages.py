"""/schedules: the list (with pause, unpause, trigger and delete), and the form that makes
one (when it runs, then the same job fields as the run form).

Delete asks first, as a token's Revoke does: the row's Delete… leads to a page asking
(/schedules/<id>/delete), which schedules.js turns into a dialog on the list; only that
question's form posts the deletion.

Every operation is the API's own (oz0/server/api/schedules.py), with the person of the
session, audited as `ui:<account>`; its refusal is shown on the page in one line.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

from quart import Blueprint
from werkzeug.datastructures import MultiDict

from oz0 import tenants
from oz0.jobs import schedules, store
from oz0.jobs.schedules import Schedule, ScheduleNotFound
from oz0.jobs.spec import JobError
from oz0.jobs.spec_text import parse_duration
from oz0.server.api import schedules as api
from oz0.server.api.common import ApiError
from oz0.ui_sessions import Session
from oz0.web.job_pages import body_from_form, command_text, short
from oz0.web.pages import Page, Pages

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "schedule.created": "Schedule created: Temporal runs it from its next time.",
        "schedule.pause": "Schedule paused: no run starts until it is unpaused.",
        "schedule.unpause": "Schedule unpaused: it runs at its next time.",
        "schedule.trigger": "Triggered: a run starts now, unless its overlap policy skips it.",
        "schedule.delete": "Schedule deleted; its jobs stay.",
    }
)


def schedule_body(form: MultiDict[str, str]) -> dict[str, Any]:
    """The form as the API's schedule body; JobError naming a field that does not parse."""
    when = form.get("when", "cron")
    body: dict[str, Any] = {
        "job": body_from_form(form),
        "overlap": form.get("overlap", schedules.DEFAULT_OVERLAP),
        "pause_on_failure": form.get("pause_on_failure") == "on",
    }
    if when == "every":
        try:
            body["every"] = parse_duration(form.get("every", ""))
        except ValueError as e:
            raise JobError(f"Every: {e}") from None
    else:
        body["cron"] = form.get("cron", "").strip()
        if form.get("timezone", "").strip():
            body["timezone"] = form.get("timezone", "").strip()
    # Blank: the API's default (1m), as when `schedule create` is given no --catchup-window.
    if form.get("catchup_window", "").strip():
        body["catchup_window"] = catchup_window(form.get("catchup_window", ""))
    return body


def catchup_window(text: str) -> float:
    """The Catch-up window field in seconds: a DURATION as `--catchup-window` takes it,
    within the API's bounds; JobError naming the field otherwise (the API's own refusal
    names the JSON key and counts in seconds, which a form's reader did not type)."""
    try:
        seconds = parse_duration(text)
    except ValueError as e:
        raise JobError(f"Catch-up window: {e}") from None
    if not schedules.MIN_CATCHUP <= seconds <= schedules.MAX_CATCHUP:
        raise JobError(
            f"Catch-up window: invalid duration {text!r}: it must be from"
            f" {_duration_text(schedules.MIN_CATCHUP)} to {_duration_text(schedules.MAX_CATCHUP)}"
        )
    return seconds


def _duration_text(seconds: float) -> str:
    """SECONDS as a duration the field takes back: 10s, 1m, 366d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def add(web: Blueprint, pages: Pages) -> None:
    db = pages.state.db

    async def tenant_names(session: Session) -> list[str]:
        scope = session.person.scope
        return await db.transaction(
            lambda conn: [t.name for t in tenants.list_tenants(conn, scope=scope)]
        )

    async def listing_page(
        session: Session, form: MultiDict[str, str], status: int = 200, error: str | None = None
    ) -> Page:
        try:
            found = await api.listing(pages.state, session.person.scope)
        except ApiError as e:
            found, error, status = [], error or e.message, max(status, e.status)
        return await pages.render(
            "schedules.html", session, status, schedules=found, form=form, error=error,
            tenants=await tenant_names(session), overlaps=schedules.OVERLAPS,
            command_text=command_text, short=short,
        )  # fmt: skip

    @web.get("/schedules")
    async def schedules_page() -> Page:
        return await listing_page(await pages.session(), MultiDict())

    @web.post("/schedules")
    async def create_schedule() -> Page:
        session, form = await pages.posted()
        try:
            body = schedule_body(form)
            await api.create(pages.state, session.person, body)
        except JobError as e:
            return await listing_page(session, form, 400, str(e))
        except ApiError as e:
            return await listing_page(session, form, e.status, e.message)
        return pages.done("/schedules", "schedule.created")

    async def act(schedule_id: str, action: str) -> Page:
        session, _ = await pages.posted()
        try:
            await api.act(pages.state, session.person, schedule_id, action)
        except ApiError as e:
            return await listing_page(session, MultiDict(), e.status, e.message)
        return pages.done("/schedules", f"schedule.{action}")

    @web.post("/schedules/<schedule_id>/pause")
    async def schedule_pause(schedule_id: str) -> Page:
        return await act(schedule_id, "pause")

    @web.post("/schedules/<schedule_id>/unpause")
    async def schedule_unpause(schedule_id: str) -> Page:
        return await act(schedule_id, "unpause")

    @web.post("/schedules/<schedule_id>/trigger")
    async def schedule_trigger(schedule_id: str) -> Page:
        return await act(schedule_id, "trigger")

    @web.get("/schedules/<schedule_id>/delete")
    async def schedule_delete_confirm(schedule_id: str) -> Page:
        # The question only (a GET changes nothing): its form posts the deletion below.
        session = await pages.session()
        scope = session.person.scope

        def read(conn: store.Conn) -> Schedule | None:
            try:
                return schedules.get(conn, schedule_id, scope=scope)
            except ScheduleNotFound:
                return None

        found = await db.transaction(read) if schedules.is_schedule_id(schedule_id) else None
        if found is None:
            return await pages.missing(session, f"schedule {schedule_id}")
        return await pages.render(
            "schedule_delete.html", session, schedule=found, command_text=command_text
        )

    @web.post("/schedules/<schedule_id>/delete")
    async def schedule_delete(schedule_id: str) -> Page:
        return await act(schedule_id, "delete")
