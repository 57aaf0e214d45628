"""/schedules: the list (with pause, unpause, trigger and delete), and the form that makes
one (when it runs, then the same job fields as the run form).

Every operation is the API's own (oz0/server/api/schedules.py), with the person of the
session, audited as `ui:<account>`; its refusal is shown on the page in one line.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint
from werkzeug.datastructures import MultiDict

from oz0 import tenants
from oz0.jobs import schedules
from oz0.jobs.spec import JobError
from oz0.jobs.spec_text import parse_duration
from oz0.server.api import schedules as api
from oz0.server.api.common import ApiError
from oz0.ui_sessions import Session
from oz0.web.job_pages import body_from_form, command_text, short
from oz0.web.pages import NOTICES, Page, Pages

NOTICES["schedule.created"] = "Schedule created: Temporal runs it from its next time."
NOTICES["schedule.pause"] = "Schedule paused: no run starts until it is unpaused."
NOTICES["schedule.unpause"] = "Schedule unpaused: it runs at its next time."
NOTICES["schedule.trigger"] = "Triggered: a run starts now, unless its overlap policy skips it."
NOTICES["schedule.delete"] = "Schedule deleted; its jobs stay."


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
    return body


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

    @web.post("/schedules/<schedule_id>/delete")
    async def schedule_delete(schedule_id: str) -> Page:
        return await act(schedule_id, "delete")
