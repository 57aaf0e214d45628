"""The web UI's Schedules page in a real browser (Debian's chromium via Playwright), against
one real server on 127.0.0.234 (its Temporal Schedules) and a real agent.

Through the page only: the empty list; a schedule made from the form (its next time shown,
its catch-up window the one `schedule show --json` reports); forms that cannot make one,
each said in one line beside a form that keeps what was typed; pause (no next time,
Unpause offered), run now (its job runs on the agent), unpause and delete, which asks first
in a dialog (Cancel keeps the schedule) or, without JavaScript, on a page of its own.
Screenshots go to `OZ0_SCREENSHOTS` (else the test's directory).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fixtures.cluster import Served, cli_command
from fixtures.polling import wait_until
from fixtures.ui_agent import Ui, ui_with_agent
from tests.web_support import browser, checked_shot, click_to_load, shots, signed_in

__all__ = ["browser"]  # the fixture, imported for the test below

SERVER = "127.0.0.234"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
BASE = f"https://{SERVER}:8443"
EDGE = f"{SERVER}:7443"
RUN_BOUND = 30.0  # generous, for a loaded 2-core machine
Page = Any  # playwright's sync Page; its stubs are not typed for mypy here


@pytest.fixture(scope="module")
def ui(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    with ui_with_agent(served, EDGE, tmp_path_factory.mktemp("web-schedules") / "node") as one:
        yield one


def row_of(page: Page, schedule_id: str) -> Any:
    return page.locator("tbody tr", has=page.get_by_text(schedule_id, exact=True))


def click(page: Page, name: str) -> None:
    click_to_load(page, page.get_by_role("button", name=name, exact=True))


def ui_page(browser: Any, ui: Ui, **options: Any) -> Page:
    """A page signed in as the UI's admin, its console messages kept for `checked_shot`."""
    options.setdefault("viewport", {"width": 1280, "height": 900})
    page: Page = signed_in(browser, SERVER, ui.files.ui_password, console=_console, **options)
    return page


# Every console message of the file's pages (`checked_shot` checks none is a CSP refusal).
_console: list[str] = []


def shown(ui: Ui, schedule_id: str) -> dict[str, Any]:
    """`orchestrator-zero schedule show ID --json`, as an operator types it."""
    done = subprocess.run(
        cli_command("schedule", "show", schedule_id, "--json"),
        env={**os.environ, **ui.files.cli_env}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


@pytest.mark.slow
def test_list_create_pause_run_now_and_delete_on_the_page(
    browser: Any, ui: Ui, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    page = ui_page(browser, ui)
    click_to_load(page, page.get_by_role("link", name="Schedules"))
    assert page.url == f"{BASE}/schedules"
    assert page.get_by_text("No schedules yet.").is_visible()

    # Forms that make nothing: one line each saying what to change, what was typed kept.
    form = page.locator("form[action='/schedules']")
    form.get_by_label("Runs", exact=True).select_option("every")
    form.get_by_label("Every", exact=True).fill("soon")
    form.get_by_label("Command", exact=True).fill("echo from the page")
    click(page, "Create schedule")
    alert = page.get_by_role("alert")
    assert re.fullmatch(r"Every: invalid duration 'soon'.*", alert.inner_text()), alert.inner_text()
    assert form.get_by_label("Command", exact=True).input_value() == "echo from the page"
    checked_shot(page, where, "schedules-bad-every.png", _console)
    form.get_by_label("Every", exact=True).fill("90m")
    click(page, "Create schedule")
    [often] = ui.api.get("/api/v1/schedules")["schedules"]
    assert row_of(page, often["id"]).locator("td").all_inner_texts()[2] == "every 90m"
    form.get_by_label("Runs", exact=True).select_option("cron")  # a new form, once made
    form.get_by_label("Command", exact=True).fill("echo from the page")
    form.get_by_label("Cron expression", exact=True).fill("61 * * * *")
    click(page, "Create schedule")
    said = page.get_by_role("alert").inner_text()
    assert "61 * * * *" in said and "Minute" in said, said
    assert len(said.splitlines()) == 1, said
    checked_shot(page, where, "schedules-bad-cron.png", _console)
    assert len(ui.api.get("/api/v1/schedules")["schedules"]) == 1

    # A catch-up window `--catchup-window` would refuse: not a duration, or under 10s.
    form.get_by_label("Cron expression", exact=True).fill("0 3 * * *")
    for typed, said in [
        ("later", r"Catch-up window: invalid duration 'later': use seconds or a number .*"),
        ("5s", r"Catch-up window: invalid duration '5s': it must be from 10s to 366d"),
    ]:
        form.get_by_label("Catch-up window", exact=True).fill(typed)
        click(page, "Create schedule")
        alert = page.get_by_role("alert").inner_text()
        assert re.fullmatch(said, alert) and len(alert.splitlines()) == 1, alert
        assert form.get_by_label("Catch-up window", exact=True).input_value() == typed
        assert form.get_by_label("Cron expression", exact=True).input_value() == "0 3 * * *"
        assert len(ui.api.get("/api/v1/schedules")["schedules"]) == 1
    checked_shot(page, where, "schedules-bad-catchup.png", _console)

    # A good one: listed with its next time, in the list and in the API alike; its
    # catch-up window the one typed, as `schedule show` reports it.
    form.get_by_label("Cron expression", exact=True).fill("0 3 * * *")
    form.get_by_label("Time zone", exact=True).fill("Europe/Paris")
    form.get_by_label("Catch-up window", exact=True).fill("2h30m")
    form.get_by_label("If the last run still runs", exact=True).select_option("buffer-one")
    click(page, "Create schedule")
    assert "Schedule created" in page.get_by_role("status").inner_text()
    [made] = [s for s in ui.api.get("/api/v1/schedules")["schedules"] if s["id"] != often["id"]]
    row = row_of(page, made["id"])
    cells = row.locator("td").all_inner_texts()
    assert cells[2] == "cron '0 3 * * *' (Europe/Paris)", cells
    assert cells[3] == "buffer-one" and cells[5] == "active", cells
    next_at = dt.datetime.fromisoformat(made["next_times"][0])
    assert next_at.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M") in cells[6], cells
    assert shown(ui, made["id"])["catchup_window"] == 9000.0
    # Left blank: the CLI's default, 1m.
    assert shown(ui, often["id"])["catchup_window"] == 60.0
    checked_shot(page, where, "schedules-made.png", _console)

    # Pause: no next time, who paused it, and Unpause offered in its place.
    click(page, f"Pause {made['id']}")
    assert "Schedule paused" in page.get_by_role("status").inner_text()
    cells = row_of(page, made["id"]).locator("td").all_inner_texts()
    assert re.fullmatch(r"paused\s+paused by \S+:admin", cells[5]) and "—" in cells[6], cells
    assert page.get_by_role("button", name=f"Unpause {made['id']}").is_visible()
    assert ui.api.get(f"/api/v1/schedules/{made['id']}")["paused"] is True
    checked_shot(page, where, "schedules-paused.png", _console)

    # Run now (paused or not): its job runs on the agent.
    click(page, f"Run now {made['id']}")
    assert "Triggered" in page.get_by_role("status").inner_text()

    def run() -> list[dict[str, Any]]:
        jobs: list[dict[str, Any]] = ui.api.get("/api/v1/jobs", {"schedule": made["id"]})["jobs"]
        return jobs if jobs and jobs[0]["ended_at"] else []

    [job] = wait_until(run, RUN_BOUND, what="the run's job to end")
    assert job["state"] == "succeeded", job
    click(page, f"Unpause {made['id']}")
    cells = row_of(page, made["id"]).locator("td").all_inner_texts()
    assert cells[5] == "active" and re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d", cells[6]), cells

    # Delete asks first, in a dialog naming the schedule; Cancel (or Escape) keeps it.
    delete = page.get_by_role("button", name=f"Delete {made['id']}…", exact=True)
    delete.click()
    dialog = page.get_by_role("dialog")
    assert made["id"] in dialog.inner_text() and dialog.is_visible()
    checked_shot(page, where, "schedules-delete-dialog.png", _console)
    dialog.get_by_role("button", name="Cancel").click()
    assert not dialog.is_visible()
    delete.click()
    page.keyboard.press("Escape")
    assert not dialog.is_visible()
    page.reload()
    assert row_of(page, made["id"]).count() == 1
    assert ui.api.get(f"/api/v1/schedules/{made['id']}")["id"] == made["id"]

    # Confirmed: gone from the list; its job stays.
    delete.click()
    click_to_load(page, dialog.get_by_role("button", name="Delete", exact=True))
    assert "Schedule deleted" in page.get_by_role("status").inner_text()
    assert row_of(page, made["id"]).count() == 0
    assert made["id"] not in [s["id"] for s in ui.api.get("/api/v1/schedules")["schedules"]]
    page.get_by_role("button", name=f"Delete {often['id']}…", exact=True).click()
    click_to_load(page, dialog.get_by_role("button", name="Delete", exact=True))
    assert page.get_by_text("No schedules yet.").is_visible()
    assert ui.api.get(f"/api/v1/jobs/{job['id']}")["state"] == "succeeded"
    checked_shot(page, where, "schedules-deleted.png", _console)
    page.context.close()


@pytest.mark.slow
def test_delete_without_javascript_asks_on_a_page_of_its_own(
    browser: Any, ui: Ui, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    made = ui.api.post(
        "/api/v1/schedules",
        {"every": 3600, "job": {"tenant": "default", "command": ["true"]}},
    )  # fmt: skip
    page = ui_page(browser, ui, java_script_enabled=False)
    page.goto(f"{BASE}/schedules")
    click_to_load(page, page.get_by_role("button", name=f"Delete {made['id']}…", exact=True))
    assert page.url.startswith(f"{BASE}/schedules/{made['id']}/delete")
    assert page.get_by_role("heading", name=f"Delete schedule {made['id']}?").is_visible()
    checked_shot(page, where, "schedule-delete-confirm.png", _console)
    # Cancel: back to the list, nothing deleted.
    click_to_load(page, page.get_by_role("link", name="Cancel"))
    assert page.url == f"{BASE}/schedules"
    assert row_of(page, made["id"]).count() == 1
    click_to_load(page, page.get_by_role("button", name=f"Delete {made['id']}…", exact=True))
    click_to_load(page, page.get_by_role("button", name="Delete", exact=True))
    assert page.url == f"{BASE}/schedules?done=schedule.delete"
    assert ui.api.get("/api/v1/schedules")["schedules"] == []
    # A schedule no longer there: the page says so, and offers nothing to delete.
    page.goto(f"{BASE}/schedules/{made['id']}/delete")
    assert page.get_by_role("button", name="Delete", exact=True).count() == 0
    page.context.close()
