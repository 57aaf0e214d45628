"""The web UI's Tokens and Jobs pages in a real browser (Debian's chromium via Playwright),
against one real server on 127.0.0.203 and a real agent, shared by the file's tests.

Tokens: the secret and join command shown once (and copied), never again; an agent joins
with the secret the page showed; revoke, with the dialog and without JavaScript; a bad TTL.
Jobs: run from the form on the real agent (exit code, stdout, stderr, followed live),
cancel (the process goes; once ended, a cancel is refused), a bad form, filters and pages.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fixtures.agent import AgentProcess
from fixtures.cluster import Served
from fixtures.polling import wait_until
from fixtures.ui_agent import Ui, ui_with_agent
from oz0 import tokens
from oz0.server import join_command
from tests.web_support import browser, checked_shot, click_to_load, curl, shots, signed_in

__all__ = ["browser"]  # the fixture, imported for the tests below

SERVER = "127.0.0.203"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
BASE = f"https://{SERVER}:8443"
EDGE = f"{SERVER}:7443"
TEAM = "edge-team"  # the tenant of the UI's tokens, so their agents run none of the jobs
IDLE = "idle-team"  # a tenant without nodes: its jobs stay queued
GONE_BOUND = 8.0  # SIGTERM, then SIGKILL after the 3 s grace
Page = Any  # playwright's sync Page; its stubs are not typed for mypy here


@pytest.fixture(scope="module")
def ui(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ui]:
    """The module's one cluster and server, and an agent (tenant default), for its tests."""
    node = tmp_path_factory.mktemp("web-tokens-jobs") / "node"
    with ui_with_agent(served, EDGE, node, tenants=(TEAM, IDLE)) as one:
        yield one


def audit(ui: Ui, target: str) -> list[tuple[str, str, str, str]]:
    """(actor kind, actor, action, details as JSON text) of TARGET's audit rows."""
    url = ui.files.main_db
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT actor_kind, actor, action, details::text FROM audit_log"
            " WHERE target = %s ORDER BY id",
            (target,),
        ).fetchall()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def all_audit_text(ui: Ui) -> str:
    url = ui.files.main_db
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT target, details::text FROM audit_log").fetchall()
    return "\n".join(f"{r[0]} {r[1]}" for r in rows)


def ui_page(browser: Any, ui: Ui, **options: Any) -> Page:
    """A page signed in as the UI's admin, its console messages kept for `checked_shot`."""
    page: Page = signed_in(browser, SERVER, ui.files.ui_password, console=_console, **options)
    return page


# Every console message of the file's pages (`checked_shot` checks none is a CSP refusal).
_console: list[str] = []


def ended(ui: Ui, job_id: str) -> bool:
    return ui.api.get(f"/api/v1/jobs/{job_id}")["ended_at"] is not None


def token_row(page: Page, token_id: str) -> Any:
    return page.locator("tr", has=page.get_by_text(token_id, exact=True))


# --- tokens ------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_token_is_shown_once_joins_an_agent_and_is_revoked(
    ui: Ui, browser: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    page = ui_page(browser, ui, permissions=["clipboard-read", "clipboard-write"])
    page.get_by_role("link", name="Tokens").click()
    page.wait_for_url(f"{BASE}/tokens")
    page.get_by_role("link", name="Create token").click()
    page.wait_for_url(f"{BASE}/tokens/new")
    assert page.get_by_label("Valid for").input_value() == tokens.DEFAULT_TTL
    assert page.get_by_label("Max uses").input_value() == str(tokens.DEFAULT_MAX_USES)
    page.get_by_label("Tenant").select_option(TEAM)
    page.get_by_label("Valid for").fill("2h")
    page.get_by_label("Labels").fill("team=data\nzone=eu-1\n")
    page.get_by_label("Description").fill("racks in Frankfurt")
    checked_shot(page, where, "token-create-form.png", _console)
    page.get_by_role("button", name="Create token").click()

    heading = page.get_by_role("heading", name=re.compile(r"^Token tok-[0-9a-f]{12} created$"))
    token_id = heading.inner_text().split()[1]
    secret = page.locator("#token-value").inner_text()
    join = page.locator("#join-command").inner_text()
    assert secret.startswith(f"{token_id}.")
    # The same join command as `orchestrator-zero token create` prints: this server's
    # file, checked against the SHA-256 it serves.
    served = subprocess.run(
        ["curl", "-ksSf", f"{BASE}/agent/oz0-node.sha256"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout.split()[0]  # fmt: skip
    assert join == join_command.render(secret, ui.files.ca_hash, [SERVER], served)
    assert page.get_by_text("This is the only time the token is shown").is_visible()
    copy = page.get_by_role("button", name="Copy join command")
    copy.click()
    assert page.evaluate("navigator.clipboard.readText()") == join
    checked_shot(page, where, "token-created.png", _console)

    # Never again: not in the list, nor after a reload, nor in the audit log.
    page.get_by_role("link", name="Back to the tokens").click()
    page.wait_for_url(f"{BASE}/tokens")
    row = token_row(page, token_id)
    assert row.get_by_text("live", exact=True).is_visible()
    assert "team=data" in row.inner_text() and "racks in Frankfurt" in row.inner_text()
    _, hidden = secret.split(".", 1)
    assert hidden not in page.content()
    page.reload()
    assert hidden not in page.content()
    [created] = audit(ui, f"token:{token_id}")
    assert created[:3] == ("ui", "admin", "token.create")
    assert hidden not in all_audit_text(ui)

    # The shown secret is the real one: an agent joins with it, accepted, in its tenant.
    agent = AgentProcess.joining(tmp_path / "joiner", [EDGE], ui.files.ca_hash, token=secret)
    try:
        agent.start()
        status = agent.wait_status(lambda s: s.get("runtime") == "running", timeout=90)
        node = ui.api.get(f"/api/v1/nodes/{status['node_id']}")
        assert (node["state"], node["tenant"]) == ("accepted", TEAM)
        assert node["labels"] == {"team": "data", "zone": "eu-1"}
    finally:
        agent.stop()
    page.reload()
    assert token_row(page, token_id).get_by_text("used up", exact=True).is_visible()
    assert token_row(page, token_id).get_by_role("button").count() == 0  # only live ones
    checked_shot(page, where, "tokens.png", _console)

    # Revoke asks first, in a dialog; Cancel there changes nothing.
    token_id = ui.api.post("/api/v1/tokens", {"tenant": TEAM, "description": "spare"})["id"]
    page.reload()
    token_row(page, token_id).get_by_role("button", name="Revoke…").click()
    dialog = page.get_by_role("dialog")
    assert token_id in dialog.inner_text()
    checked_shot(page, where, "token-revoke-dialog.png", _console)
    dialog.get_by_role("button", name="Cancel").click()
    assert not dialog.is_visible()
    assert not _revoked(ui, token_id)
    token_row(page, token_id).get_by_role("button", name="Revoke…").click()
    dialog.get_by_role("button", name="Revoke").click()
    assert page.get_by_role("status").inner_text().startswith("Token revoked.")
    assert token_row(page, token_id).get_by_text("revoked", exact=True).is_visible()
    assert _revoked(ui, token_id)
    assert audit(ui, f"token:{token_id}")[-1][:3] == ("ui", "admin", "token.revoke")


def _revoked(ui: Ui, token_id: str) -> bool:
    [token] = [t for t in ui.api.get("/api/v1/tokens")["tokens"] if t["id"] == token_id]
    return bool(token["revoked"])


@pytest.mark.slow
def test_revoke_without_javascript_asks_on_a_page_and_bad_input_creates_nothing(
    ui: Ui, browser: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    token_id = ui.api.post("/api/v1/tokens", {"tenant": TEAM})["id"]
    page = ui_page(browser, ui, java_script_enabled=False)
    page.goto(f"{BASE}/tokens")
    token_row(page, token_id).get_by_role("button", name="Revoke…").click()
    page.wait_for_url(re.compile(rf"{re.escape(f'{BASE}/tokens/{token_id}/revoke')}\??$"))
    checked_shot(page, where, "token-revoke-confirm.png", _console)
    assert not _revoked(ui, token_id)
    page.get_by_role("button", name="Revoke").click()
    page.wait_for_url(f"{BASE}/tokens?done=token.revoked")
    assert _revoked(ui, token_id)
    # Revoked already (another tab, another server): refused, said so, nothing changes.
    page.goto(f"{BASE}/tokens/{token_id}/revoke")
    assert page.get_by_role("alert").inner_text() == f"token {token_id} is already revoked"

    before = len(ui.api.get("/api/v1/tokens")["tokens"])
    for field, value, error in [
        ("Valid for", "1x", "invalid ttl '1x': use a number with d, h, m or s"),
        ("Max uses", "2147483648", "invalid max uses 2147483648: use 0 for unlimited"),
        ("Labels", "Team=x", "invalid label key 'Team'"),
        ("Labels", "team", "invalid label 'team': use KEY=VALUE"),
    ]:
        page.goto(f"{BASE}/tokens/new")
        page.get_by_label("Description").fill("kept on error")
        page.get_by_label(field).fill(value)
        click_to_load(page, page.get_by_role("button", name="Create token"))
        alerts = page.get_by_role("alert")
        assert alerts.count() == 1 and alerts.inner_text().startswith(error), error
        assert page.get_by_label(field).input_value() == value  # the form keeps it
        assert page.get_by_label("Description").input_value() == "kept on error"
        if value == "1x":
            checked_shot(page, where, "token-create-error.png", _console)
    assert len(ui.api.get("/api/v1/tokens")["tokens"]) == before
    assert "kept on error" not in all_audit_text(ui)


# --- jobs --------------------------------------------------------------------------------


def job_id_of(page: Page) -> str:
    page.wait_for_url(re.compile(rf"{re.escape(BASE)}/jobs/job-[0-9a-f]{{12}}\?done=job\.started"))
    found = re.search(r"/jobs/(job-[0-9a-f]{12})", page.url)
    assert found is not None
    return found.group(1)


def run_from_form(page: Page, command: str, **fields: str) -> str:
    page.goto(f"{BASE}/jobs/new")
    page.get_by_label("Command").fill(command)
    for label, value in fields.items():
        field = page.get_by_label(label)
        if field.evaluate("e => e.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    page.get_by_role("button", name="Run").click()
    return job_id_of(page)


def job_state(page: Page) -> str:
    return str(page.locator("[data-field=job-state] .state").inner_text())


@pytest.mark.slow
def test_a_job_run_from_the_form_shows_exit_code_and_output_live(
    ui: Ui, browser: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    page = ui_page(browser, ui)
    page.goto(f"{BASE}/jobs/new")
    checked_shot(page, where, "job-run-form.png", _console)
    job_id = run_from_form(
        page,
        "sh -c 'echo hello; sleep 1; echo oops >&2; printf \"caf\\303\\251 \\377\\n\"; exit 3'",
        Environment="GREETING=kept-out-of-pages",
        **{"Secret variable 1": "DB_PASSWORD", "Secret value 1": "secret-out-of-pages"},
        Memory="512M",
        CPU="0.5",
        **{"If its node is lost": "wait", "Lost after": "2h"},
    )
    page.evaluate("window.notReloaded = true")
    # jobs.js follows the job: the state and output change in place, without a reload.
    page.locator("[data-field=job-state]").get_by_text("failed").wait_for(timeout=60_000)
    assert page.evaluate("window.notReloaded") is True
    assert page.locator("[data-field=exit-code]").inner_text() == "3"
    output = page.locator(".attempt-output pre")
    assert "hello" in output.inner_text()
    assert page.locator("pre .stderr").first.inner_text().startswith("oops")
    assert "café \ufffd" in output.inner_text()  # UTF-8, the bad byte replaced
    assert page.get_by_role("button", name="Cancel job").count() == 0
    # What the attempt's node applied (limits), once it has ended, also in place.
    assert page.locator("[data-field=applied] li").inner_text().startswith("attempt 1: ")
    checked_shot(page, where, "job-ended-live.png", _console)

    # The page as the server renders it says the same, with the attempt and its node.
    page.reload()
    assert job_state(page) == "failed"
    assert page.locator("[data-field=exit-code]").inner_text() == "3"
    assert page.locator("pre .stderr").first.inner_text().startswith("oops")
    assert "café \ufffd" in page.locator(".attempt-output pre").inner_text()
    attempt = page.locator("[data-field=attempts] tr")
    assert attempt.count() == 1 and "exit" in attempt.inner_text()
    link = attempt.get_by_role("link", name=ui.node_id)
    assert link.get_attribute("href") == f"/nodes/{ui.node_id}"
    assert page.locator("[data-field=limits]").inner_text() == "memory 512 MiB, cpu 0.5"
    assert page.locator("[data-field=applied] li").inner_text().startswith("attempt 1: ")
    assert ui.api.get(f"/api/v1/jobs/{job_id}")["limits"] == {"memory": 512 << 20, "cpu": 0.5}
    assert page.locator("[data-field=on-lost]").inner_text() == "wait 2 h, then move"
    shown = ui.api.get(f"/api/v1/jobs/{job_id}")
    assert (shown["on_lost"], shown["lost_after"]) == ("wait", 7200.0)
    # The environment's names are shown, its values (perhaps secrets) never.
    assert "GREETING" in page.inner_text("main") and "kept-out-of-pages" not in page.content()
    assert "DB_PASSWORD" in page.inner_text("main") and "secret-out-of-pages" not in page.content()
    assert ui.api.get(f"/api/v1/jobs/{job_id}")["secret_env"] == ["DB_PASSWORD"]
    checked_shot(page, where, "job-ended.png", _console)
    [run] = audit(ui, f"job:{job_id}")
    assert run[:3] == ("ui", "admin", "job.run")
    assert json.loads(run[3])["command"][0] == "sh"


@pytest.mark.slow
def test_cancel_from_the_job_page_stops_the_process(ui: Ui, browser: Any, tmp_path: Path) -> None:
    where = shots(tmp_path)
    page = ui_page(browser, ui)
    job_id = run_from_form(page, "sh -c 'echo pid $$; exec sleep 60'")
    pid_line = page.locator(".attempt-output pre").get_by_text(re.compile(r"pid \d+"))
    pid_line.wait_for(timeout=60_000)
    pid = int(pid_line.inner_text().split()[1])
    assert job_state(page) == "running"
    checked_shot(page, where, "job-running.png", _console)
    # Another page on the job, without JavaScript: its Cancel button stays once it ends.
    stale = ui_page(browser, ui, java_script_enabled=False)
    stale.goto(f"{BASE}/jobs/{job_id}")
    assert stale.get_by_role("link", name="Refresh").is_visible()

    page.get_by_role("button", name="Cancel job").click()
    page.wait_for_url(f"{BASE}/jobs/{job_id}?done=job.cancel")
    page.locator("[data-field=job-state]").get_by_text("cancelled").wait_for(timeout=30_000)
    wait_until(lambda: not _alive(pid), GONE_BOUND, f"process {pid} of {job_id} gone")
    assert ui.api.get(f"/api/v1/jobs/{job_id}")["state"] == "cancelled"
    assert audit(ui, f"job:{job_id}")[-1][:3] == ("ui", "admin", "job.cancel")

    stale.get_by_role("button", name="Cancel job").click()
    assert stale.get_by_role("alert").inner_text() == (
        f"job {job_id} has ended already (cancelled)"
    )
    assert audit(ui, f"job:{job_id}")[-1][2] == "job.cancel"  # nothing more recorded


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
def test_a_bad_run_form_creates_nothing(ui: Ui, browser: Any, tmp_path: Path) -> None:
    where = shots(tmp_path)
    page = ui_page(browser, ui)
    before = len(ui.api.get("/api/v1/jobs")["jobs"])
    for fields, error in [
        ({"Command": ""}, "Command: give the program to run and its arguments"),
        ({"Command": "echo 'unclosed"}, "Command: No closing quotation"),
        ({"Command": "true", "Timeout": "soon"}, "Timeout: invalid duration 'soon'"),
        ({"Command": "true", "Selector": "Role=web"}, "Selector: invalid selector 'Role=web'"),
        ({"Command": "true", "Environment": "OZ0_NODE_ID=x"}, "Environment: invalid env"),
        ({"Command": "true", "Retries": "101"}, "retries must be a whole number from 0 to 100"),
        (
            {
                "Command": "true",
                "Environment": "KEY=x",
                "Secret variable 1": "KEY",
                "Secret value 1": "never-sent-back",
            },
            "KEY is given both in env and in secret_env",
        ),
        ({"Command": "true", "Secret value 2": "never-sent-back"}, "Secrets: a secret value"),
        ({"Command": "true", "Memory": "lots"}, "Memory: invalid size 'lots'"),
        ({"Command": "true", "CPU": "0"}, "CPU: invalid cpu '0'"),
        ({"Command": "true", "Lost after": "2s"}, "Lost after: invalid lost-after '2s'"),
    ]:
        page.goto(f"{BASE}/jobs/new")
        for label, value in fields.items():
            page.get_by_label(label, exact=True).fill(value)
        page.get_by_role("button", name="Run").click()
        page.wait_for_url(f"{BASE}/jobs")
        alerts = page.get_by_role("alert")
        assert alerts.count() == 1 and alerts.inner_text().startswith(error), error
        assert page.get_by_label("Command").input_value() == fields["Command"]
        # A secret's value is asked for again, never sent back in the page.
        assert "never-sent-back" not in page.content()
        if not fields["Command"]:
            checked_shot(page, where, "job-run-form-error.png", _console)
    assert len(ui.api.get("/api/v1/jobs")["jobs"]) == before


@pytest.mark.slow
def test_the_job_list_filters_by_state_and_tenant_and_pages(
    ui: Ui, browser: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    done = {
        code: ui.api.post("/api/v1/jobs", {"command": ["sh", "-c", f"exit {code}"]})["id"]
        for code in (0, 1)
    }
    queued = [
        ui.api.post("/api/v1/jobs", {"tenant": IDLE, "command": ["true"]})["id"] for _ in range(51)
    ]
    try:
        for job_id in done.values():
            wait_until(partial(ended, ui, job_id), 60, f"{job_id} ended")
        page = ui_page(browser, ui)
        page.get_by_role("link", name="Jobs").click()
        page.get_by_label("State").select_option("failed")
        page.get_by_role("button", name="Filter").click()
        page.wait_for_url(f"{BASE}/jobs?state=failed&tenant=")
        ids = page.locator("table.jobs tbody a.mono").all_inner_texts()
        assert done[1] in ids and done[0] not in ids
        page.goto(f"{BASE}/jobs?state=succeeded")
        ids = page.locator("table.jobs tbody a.mono").all_inner_texts()
        assert done[0] in ids and done[1] not in ids
        checked_shot(page, where, "jobs-filtered.png", _console)

        page.goto(f"{BASE}/jobs?tenant={IDLE}")
        first = page.locator("table.jobs tbody tr").count()
        assert first == 50
        checked_shot(page, where, "jobs.png", _console)
        page.get_by_role("link", name="Next →").click()
        page.wait_for_url(f"{BASE}/jobs?tenant={IDLE}&page=2")
        rows = page.locator("table.jobs tbody tr")
        assert rows.count() == 1 and rows.inner_text().startswith(queued[0])  # the oldest
        assert page.get_by_role("link", name="Next →").count() == 0
        page.get_by_role("link", name="← Previous").click()
        page.wait_for_url(f"{BASE}/jobs?tenant={IDLE}")
    finally:
        for job_id in queued:
            ui.api.post(f"/api/v1/jobs/{job_id}/cancel", {})


@pytest.mark.slow
def test_the_pages_and_the_live_endpoint_need_a_session(ui: Ui) -> None:
    for path in ("/tokens", "/tokens/new", "/jobs", "/jobs/new", "/jobs/job-0123456789ab",
                 "/jobs/job-0123456789ab/live.json"):  # fmt: skip
        answer = curl("-o", "/dev/null", "-w", "%{http_code} %{redirect_url}", f"{BASE}{path}")
        assert answer.stdout == f"303 {BASE}/", path
