"""The web UI's Audit, Tenants, Servers and Account pages, and `server ui-password`, in
Debian's chromium (Playwright) against one real server on 127.0.0.205 shared by the file.

Each test starts from a known admin password and no sessions or failed sign-ins (the
`admin` fixture), so the tests do not depend on their order.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fixtures.cluster import ClusterFiles, Served, cli_command
from fixtures.job_rows import add_node
from oz0 import audit, passwords, ui_accounts
from oz0 import ui_sessions as sessions
from oz0.context import Context
from tests.web_support import browser, click_to_load, curl, shots, sign_in, signed_in

__all__ = ["browser"]  # the fixture, used by name

ADDRESS = "127.0.0.205"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
BASE = f"https://{ADDRESS}:8443"
PASSWORD = "the-test-password-1"


@pytest.fixture(scope="module")
def cluster(served: Served) -> tuple[ClusterFiles, str]:
    """The module's one cluster and server: the files and the server's ID."""
    up = next(line for line in served.server.stdout_lines if " is up: " in line)
    return served.files, up.split()[1]


CONN_CLUSTER = "served"


@pytest.fixture
def admin(conn: psycopg.Connection[Any]) -> str:
    """The admin account with password PASSWORD, no sessions, no failed sign-ins."""
    conn.execute(
        "UPDATE ui_accounts SET password_hash = %s WHERE username = 'admin'",
        (passwords.hash_password(PASSWORD),),
    )
    conn.execute("DELETE FROM ui_sessions")
    conn.execute("DELETE FROM ui_sign_in_failures")
    return PASSWORD


def new_page(browser: Any) -> Any:
    context = browser.new_context(ignore_https_errors=True)
    context.set_default_timeout(10_000)  # every page here answers in well under a second
    return context.new_page()


def run_cli(files: ClusterFiles, *args: str) -> Any:
    """`orchestrator-zero ARGS --json` as the cluster's admin, in a process of its own."""
    done = subprocess.run(
        cli_command(*args), env={**os.environ, **files.cli_env}, capture_output=True,
        text=True, timeout=60, check=True,
    )  # fmt: skip
    return json.loads(done.stdout)


def shown_ids(page: Any) -> list[int]:
    return [int(i) for i in page.locator("tbody tr[data-entry]").evaluate_all(
        "rows => rows.map(r => r.dataset.entry)")]  # fmt: skip


def audit_rows(conn: psycopg.Connection[Any], **filters: str) -> list[audit.Entry]:
    return audit.entries(conn, limit=10_000, **filters)  # type: ignore[arg-type]


def test_audit_filters_and_keyset_pages(
    cluster: tuple[ClusterFiles, str],
    conn: psycopg.Connection[Any],
    admin: str,
    browser: Any,
    tmp_path: Path,
) -> None:
    # 130 rows of three kinds, written in the test's own connection (cheap).
    alice, bob = audit.Actor("operator", "alice"), audit.Actor("ui", "bob")
    with conn.transaction():
        for i in range(130):
            if i % 3 == 0:
                audit.record(conn, alice, "test.block", f"node:n-{i}", {"reason": f"r{i}"})
            elif i % 3 == 1:
                audit.record(conn, bob, "test.cancel", f"job:j-{i}", {"was": {"n": i}})
            else:
                audit.record(conn, alice, "test.other", "tenant:blue")
    page = signed_in(browser, ADDRESS, admin)
    page.goto(f"{BASE}/audit")
    assert page.get_by_role("heading", name="Audit log").is_visible()
    page.screenshot(path=str(shots(tmp_path) / "audit.png"), full_page=True)

    # Paging: Next until the end, every row exactly once, newest first (no gap, no overlap).
    everything = [e.id for e in audit_rows(conn)]
    seen, pages_seen = shown_ids(page), 1
    assert len(seen) == 50
    while page.get_by_role("link", name="Next →").count():
        click_to_load(page, page.get_by_role("link", name="Next →"))
        assert re.search(r"[?&]before=\d+", page.url)
        ids = shown_ids(page)
        assert 0 < len(ids) <= 50
        seen += ids
        pages_seen += 1
    assert seen == everything and pages_seen == -(-len(everything) // 50)
    # Previous goes back a page exactly: the second page, then the first (no cursor).
    click_to_load(page, page.get_by_role("link", name="← Previous"))
    assert shown_ids(page) == everything[(pages_seen - 2) * 50 : (pages_seen - 1) * 50]
    page.goto(f"{BASE}/audit?before={everything[50] + 1}")
    click_to_load(page, page.get_by_role("link", name="← Previous"))
    assert page.url == f"{BASE}/audit" and shown_ids(page) == everything[:50]
    for junk in ("x", "²", "-1", "9" * 40):  # not a cursor: the newest page
        assert page.goto(f"{BASE}/audit?before={junk}").status == 200
        assert shown_ids(page) == everything[:50]

    # Filters: action (offered from the actions seen), actor, target; they stay in the URL.
    page.goto(f"{BASE}/audit")
    offered = page.locator("#actions-seen option").evaluate_all("o => o.map(x => x.value)")
    assert {"test.block", "test.cancel", "test.other", "ui.login"} <= set(offered)
    page.get_by_label("Action").fill("test.block")
    click_to_load(page, page.get_by_role("button", name="Filter"))
    assert "action=test.block" in page.url
    assert shown_ids(page) == [e.id for e in audit_rows(conn, action="test.block")]
    page.get_by_label("Actor").fill("operator:alice")
    click_to_load(page, page.get_by_role("button", name="Filter"))
    assert shown_ids(page) == [e.id for e in audit_rows(conn, action="test.block")]
    page.get_by_label("Action").fill("")
    click_to_load(page, page.get_by_role("button", name="Filter"))
    alice_ids = [e.id for e in audit_rows(conn, actor="operator:alice")]
    assert len(alice_ids) > 50 and shown_ids(page) == alice_ids[:50]
    click_to_load(page, page.get_by_role("link", name="Next →"))  # paging keeps the filter
    assert "actor=operator%3Aalice" in page.url and shown_ids(page) == alice_ids[50:100]

    page.goto(f"{BASE}/audit?actor=ui:bob")
    assert shown_ids(page) == [e.id for e in audit_rows(conn, actor="ui:bob")][:50]
    # A name with a colon of its own: the kind is what precedes the first one.
    with conn.transaction():
        audit.record(conn, audit.Actor("server", "local:box"), "test.local", "ui:admin")
    for actor in ("server:local:box", "local:box"):
        page.goto(f"{BASE}/audit?actor={actor}")
        assert page.locator("tbody tr[data-entry] td").nth(2).all_inner_texts() == ["test.local"]
    page.goto(f"{BASE}/audit?actor=ui:local:box")
    assert shown_ids(page) == []
    page.goto(f"{BASE}/audit?target=node:n-9")
    row = page.locator("tbody tr[data-entry]")
    assert row.count() == 1
    assert row.get_by_role("link", name="node:n-9").get_attribute("href") == "/nodes/n-9"
    assert row.locator("dl.details").inner_text().split() == ["reason", "r9"]
    page.goto(f"{BASE}/audit?target=job:j-10")
    assert page.get_by_role("link", name="job:j-10").get_attribute("href") == "/jobs/j-10"
    assert '"n": 10' in page.locator("dl.details dd").inner_text()

    page.goto(f"{BASE}/audit?action=test.block&actor=operator:alice&target=node:n-3")
    assert page.get_by_label("Target").input_value() == "node:n-3"
    page.set_viewport_size({"width": 1280, "height": 720})
    page.goto(f"{BASE}/audit?actor=operator:alice")
    page.screenshot(path=str(shots(tmp_path) / "audit-filtered.png"), full_page=True)
    page.goto(f"{BASE}/audit?action=no.such.action")
    assert page.get_by_text("No entries match these filters.").is_visible()

    # The API, and the CLI on it, take the same actor filter and cursor.
    files, _ = cluster
    newest = run_cli(files, "audit", "list", "--actor", "ui:bob", "--limit", "10", "--json")
    older = run_cli(files, "audit", "list", "--actor", "ui:bob", "--limit", "10", "--json",
                    "--before", str(newest[-1]["id"]))  # fmt: skip
    bob_ids = [e.id for e in audit_rows(conn, actor="ui:bob")]
    assert [e["id"] for e in newest + older] == bob_ids[:20]
    ctx = Context.load(files.context_dir)
    refused = curl("--cert", str(ctx.cert_path), "--key", str(ctx.key_path),
                   f"{BASE}/api/v1/audit?before=%C2%B2")  # fmt: skip
    assert json.loads(refused.stdout) == {
        "error": "before must be an audit entry's id (a whole number)"
    }


def test_create_tenant_and_a_bad_name_refused(
    cluster: tuple[ClusterFiles, str],
    conn: psycopg.Connection[Any],
    admin: str,
    browser: Any,
    tmp_path: Path,
) -> None:
    files, _ = cluster
    page = signed_in(browser, ADDRESS, admin)
    page.goto(f"{BASE}/tenants")
    page.get_by_label("Name").fill("blue-team")
    page.get_by_role("button", name="Create tenant").click()
    assert page.get_by_role("status").inner_text().startswith("Tenant created")
    assert page.locator("tr[data-tenant='blue-team']").is_visible()

    assert "blue-team" in [t["name"] for t in run_cli(files, "tenant", "list", "--json")]
    [made] = audit_rows(conn, action="tenant.create", target="tenant:blue-team")
    assert (made.actor_kind, made.actor) == ("ui", "admin")

    # Its nodes by state, each count linking to the Nodes page filtered so.
    for state in ("accepted", "accepted", "pending", "blocked"):
        add_node(conn, tenant="blue-team", state=state, connected=False)
    page.goto(f"{BASE}/tenants")
    counts = page.locator("tr[data-tenant='blue-team'] a.count")
    assert counts.all_inner_texts() == ["pending 1", "accepted 2", "blocked 1"]
    assert counts.first.get_attribute("href") == "/nodes?tenant=blue-team&state=pending"
    assert page.locator("tr[data-tenant='default'] td").nth(1).inner_text() == "no nodes"
    # How long it keeps finished jobs and how many may be queued (`tenant set`).
    cells = page.locator("tr[data-tenant='blue-team'] td").all_inner_texts()
    assert cells[2:4] == ["30d", "10000"]

    before = conn.execute("SELECT count(*) FROM tenants").fetchone()
    for bad, says in (
        ("Bad_Name", "Invalid tenant name 'Bad_Name'"),
        ("temporal-x", "is reserved"),
        ("blue-team", "Tenant blue-team already exists"),
    ):
        page.get_by_label("Name").fill(bad)
        with page.expect_response(f"{BASE}/tenants") as answer:
            page.get_by_role("button", name="Create tenant").click()
        assert answer.value.status in (400, 409)
        alert = page.get_by_role("alert")
        assert alert.count() == 1 and says in alert.inner_text()
        assert page.get_by_label("Name").input_value() == bad
    assert conn.execute("SELECT count(*) FROM tenants").fetchone() == before
    page.get_by_label("Name").fill("Bad_Name")
    page.get_by_role("button", name="Create tenant").click()
    page.screenshot(path=str(shots(tmp_path) / "tenants.png"), full_page=True)


def test_servers_page_lists_every_server_up_or_down(
    cluster: tuple[ClusterFiles, str],
    conn: psycopg.Connection[Any],
    admin: str,
    browser: Any,
    tmp_path: Path,
) -> None:
    _, server_id = cluster
    # A server that stopped beating a minute ago (its row is kept for a day).
    conn.execute(
        "INSERT INTO servers (id, advertise, version, started_at, last_heartbeat, temporal_state)"
        " VALUES ('s-gone', '127.0.0.254', '0.0.1', now() - interval '1 hour',"
        " now() - interval '1 minute', 'serving')"
        " ON CONFLICT (id) DO NOTHING"
    )
    page = signed_in(browser, ADDRESS, admin)
    page.goto(f"{BASE}/servers")
    ours = page.locator(f"tr[data-server='{server_id}']")
    ours.locator("[data-field=up]").wait_for()
    cells = ours.locator("td").all_inner_texts()
    assert cells[0] == f"{server_id} this server" and cells[1] == ADDRESS
    assert cells[2] == "up" and cells[3] == "serving"
    assert ours.get_attribute("aria-current") == "true"
    gone = page.locator("tr[data-server='s-gone']").locator("td").all_inner_texts()
    assert gone[:4] == ["s-gone", "127.0.0.254", "down", "was serving"]
    assert page.get_by_text("1 of 2 up.").is_visible()
    page.screenshot(path=str(shots(tmp_path) / "servers.png"), full_page=True)

    # None of these pages has inline script or style (the CSP would block it).
    for path in ("/audit", "/tenants", "/servers", "/account"):
        page.goto(f"{BASE}{path}")
        html = page.content()
        assert " style=" not in html and "<style" not in html and " onclick=" not in html
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", html, re.S)
        assert scripts and all('src="/ui/static/' in a and not body for a, body in scripts)
    conn.execute("DELETE FROM servers WHERE id = 's-gone'")


def change(page: Any, current: str, new: str, again: str | None = None) -> Any:
    page.goto(f"{BASE}/account")
    page.get_by_label("Current password").fill(current)
    page.get_by_label("New password", exact=True).fill(new)
    page.get_by_label("New password again").fill(new if again is None else again)
    with page.expect_response(f"{BASE}/account/password") as answer:
        page.get_by_role("button", name="Change password").click()
    return answer.value


def failures(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM ui_sign_in_failures").fetchone()
    assert row is not None
    return int(row[0])


def test_change_password(
    conn: psycopg.Connection[Any], admin: str, browser: Any, tmp_path: Path
) -> None:
    page = signed_in(browser, ADDRESS, admin)
    other = signed_in(browser, ADDRESS, admin)  # another session of the account

    assert change(page, "not the password", "a-new-password-2").status == 400
    assert page.get_by_role("alert").inner_text() == "The current password is wrong."
    assert failures(conn) == 1  # a failed sign-in, for the rate limit
    [failed] = audit_rows(conn, action="ui.login.failed")[:1]
    assert (failed.actor_kind, failed.actor) == ("ui", "admin")
    page.screenshot(path=str(shots(tmp_path) / "account-error.png"), full_page=True)

    assert change(page, admin, "short-11chr").status == 400
    assert page.get_by_role("alert").inner_text() == (
        f"The new password is too short: use at least {ui_accounts.MIN_PASSWORD} characters."
    )
    assert change(page, admin, "a-new-password-2", "a-new-password-3").status == 400
    assert "differ" in page.get_by_role("alert").inner_text()
    assert failures(conn) == 1  # refused by the rules, the current one not even checked

    assert change(page, admin, "a-new-password-2").status == 303
    assert page.get_by_role("status").inner_text().startswith("Password changed.")
    page.screenshot(path=str(shots(tmp_path) / "account.png"), full_page=True)
    page.goto(f"{BASE}/overview")
    assert page.url == f"{BASE}/overview"  # this session goes on
    other.goto(f"{BASE}/overview")
    assert other.url == f"{BASE}/"  # the other one has ended
    [changed] = audit_rows(conn, action="ui.password.changed")
    assert (changed.actor_kind, changed.actor, changed.target) == ("ui", "admin", "ui:admin")
    assert changed.details == {"sessions_ended": 1}

    old = new_page(browser)
    sign_in(old, ADDRESS, admin)
    assert old.get_by_role("alert").inner_text() == "Wrong username or password."
    signed_in(browser, ADDRESS, "a-new-password-2")
    page.goto(f"{BASE}/account")
    assert page.locator("dl.fields dd").nth(2).inner_text() == "2 open, on every server"

    # Wrong current passwords and failed sign-ins share the account's limit.
    while failures(conn) < sessions.FREE_FAILURES:
        assert change(page, "wrong again", "a-new-password-4").status == 400
    assert change(page, "a-new-password-2", "a-new-password-4").status == 429
    assert page.get_by_role("alert").inner_text().startswith("Too many failed sign-ins")
    stale = new_page(browser)
    sign_in(stale, ADDRESS, "a-new-password-2")
    assert stale.get_by_role("alert").inner_text().startswith("Too many failed sign-ins")


def reset(
    files: ClusterFiles, account: str, key: Path | None = None
) -> subprocess.CompletedProcess[str]:
    key = key or files.master_key
    return subprocess.run(
        cli_command("server", "ui-password", account, "--master-key-file", str(key)),
        env={**os.environ, "OZ0_DB": files.url.conninfo}, capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip


def test_server_ui_password_resets_a_lost_one(
    cluster: tuple[ClusterFiles, str],
    conn: psycopg.Connection[Any],
    admin: str,
    browser: Any,
    tmp_path: Path,
) -> None:
    files, _ = cluster
    page = signed_in(browser, ADDRESS, admin)
    second = signed_in(browser, ADDRESS, admin)
    done = reset(files, "admin")
    assert done.returncode == 0, done.stderr
    printed = re.fullmatch(r"web UI account admin: new password (\S+)  \(shown only now\)",
                           done.stdout.splitlines()[0])  # fmt: skip
    assert printed is not None
    new = printed[1]
    assert new not in done.stderr and len(new) >= ui_accounts.MIN_PASSWORD
    for ended in (page, second):
        ended.goto(f"{BASE}/overview")
        assert ended.url == f"{BASE}/"
    [entry] = audit_rows(conn, action="ui.password.reset")
    assert (entry.actor_kind, entry.target) == ("server", "ui:admin")
    assert entry.actor.startswith("local:") and entry.details == {"sessions_ended": 2}
    old = new_page(browser)
    sign_in(old, ADDRESS, admin)
    assert old.get_by_role("alert").inner_text() == "Wrong username or password."
    signed_in(browser, ADDRESS, new)

    # An unknown account: one line, exit 1, nothing changed.
    stored = conn.execute("SELECT username, password_hash FROM ui_accounts").fetchall()
    logged = len(audit_rows(conn))
    unknown = reset(files, "bob")
    assert unknown.returncode == 1 and unknown.stdout == ""
    assert unknown.stderr == "error: the cluster has no web UI account bob\n"
    assert conn.execute("SELECT username, password_hash FROM ui_accounts").fetchall() == stored
    assert len(audit_rows(conn)) == logged

    # Another cluster's master key proves nothing: refused, nothing changed.
    other_key = tmp_path / "other.key"
    other_key.write_bytes(secrets.token_bytes(32))
    other_key.chmod(0o600)
    foreign = reset(files, "admin", other_key)
    assert foreign.returncode == 1 and foreign.stdout == ""
    assert foreign.stderr.startswith("error: ") and foreign.stderr.count("\n") == 1
    assert conn.execute("SELECT username, password_hash FROM ui_accounts").fetchall() == stored
