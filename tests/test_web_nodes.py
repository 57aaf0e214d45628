"""The web UI's Nodes pages in a real browser (Debian's chromium through Playwright),
against one real server on 127.0.0.201 shared by the file, with a real agent where a
node's machine matters (accept, block, unblock, purge).

The list's rows and the nodes whose agent does not matter are rows written straight into
the cluster's database, as a joined node's are; everything else goes through the server.
Screenshots go to the test's temporary directory (`OZ0_SCREENSHOTS` names another).
"""

from __future__ import annotations

import datetime as dt
import re
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from fixtures import job_rows
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, Served
from oz0 import audit, tenants
from oz0.web import paging
from tests.conftest import CliRunner
from tests.web_support import browser, curl, shots, sign_in

__all__ = ["browser"]  # the fixture, from the UI's own tests

SERVER = "127.0.0.201"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
BASE = f"https://{SERVER}:8443"
EDGE = f"{SERVER}:7443"
Conn = psycopg.Connection[Any]


@pytest.fixture(scope="module")
def files(served: Served) -> ClusterFiles:
    return served.files


CONN_CLUSTER = "served"
# No nodes (nor their jobs) left from an earlier test.
CLEAN = ("DELETE FROM job_attempts", "DELETE FROM jobs", "DELETE FROM nodes")


@pytest.fixture
def page(files: ClusterFiles, browser: Any) -> Iterator[Any]:
    context = browser.new_context(ignore_https_errors=True)
    signed_in = context.new_page()
    sign_in(signed_in, SERVER, files.ui_password)
    signed_in.wait_for_url(f"{BASE}/overview")
    yield signed_in
    context.close()


def joined_node(
    conn: Conn,
    *,
    state: str = "accepted",
    tenant: str = "default",
    hostname: str = "",
    labels: dict[str, str] | None = None,
    joined_ago: float = 0.0,
) -> str:
    """A node row as a join leaves it (accepted ones with a certificate), not connected."""
    return job_rows.add_node(
        conn, state=state, tenant=tenant, hostname=hostname, labels=labels, connected=False,
        joined_at=dt.datetime.now(dt.UTC) - dt.timedelta(seconds=joined_ago),
        certificate=None if state == "pending" else "issued",
    )  # fmt: skip


def state_of(conn: Conn, node_id: str) -> str | None:
    row = conn.execute("SELECT state FROM nodes WHERE id = %s", (node_id,)).fetchone()
    return None if row is None else str(row[0])


def actions_of(conn: Conn, node_id: str) -> list[tuple[str, str, str]]:
    """The node's audit rows, oldest first: (actor kind, actor, action)."""
    rows = conn.execute(
        "SELECT actor_kind, actor, action FROM audit_log WHERE target = %s ORDER BY id",
        (f"node:{node_id}",),
    ).fetchall()
    return [(str(k), str(a), str(x)) for k, a, x in rows]


def offered(page: Any) -> set[str]:
    """The names of the buttons in the node page's Actions."""
    return {text.strip() for text in page.locator("#actions button").all_inner_texts()}


def shown(cli: CliRunner, files: ClusterFiles, node_id: str) -> dict[str, Any]:
    result = cli("node", "show", node_id, "--json", env=files.cli_env)
    assert result.code == 0, result.err
    value: dict[str, Any] = result.json()
    return value


def no_inline_code(html: str) -> None:
    assert re.search(r"<script(?![^>]*\bsrc=)", html) is None, "an inline script"
    assert " style=" not in html and " onclick=" not in html


@pytest.mark.slow
def test_a_real_agent_accepted_blocked_unblocked_and_purged_from_its_page(
    files: ClusterFiles,
    conn: Conn,
    page: Any,
    cli: CliRunner,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    where = shots(tmp_path)
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE], files.ca_hash, labels={"role": "web"}
    ).start()
    agents.append(agent)
    node_id = agent.wait_status(lambda s: s.get("state") == "pending", timeout=60)["node_id"]

    page.goto(f"{BASE}/nodes/{node_id}")
    assert page.get_by_role("heading", name=node_id).is_visible()
    assert offered(page) == {"Accept", "Reject", "Block", "Delete"}
    page.screenshot(path=str(where / "node-pending.png"), full_page=True)

    page.get_by_role("button", name="Accept").click()
    assert "Node accepted" in page.get_by_role("status").inner_text()
    assert shown(cli, files, node_id)["state"] == "accepted"
    agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)
    page.reload()
    assert offered(page) == {"Block", "Delete", "Purge"}
    page.screenshot(path=str(where / "node-accepted.png"), full_page=True)

    # A blank reason passes the browser's `required`; the server refuses it.
    page.get_by_label("Reason", exact=True).fill("   ")
    page.get_by_role("button", name="Block").click()
    assert "a reason is required" in page.get_by_role("alert").inner_text()
    assert shown(cli, files, node_id)["state"] == "accepted"

    page.get_by_label("Reason", exact=True).fill("lost laptop")
    page.locator("#actions").screenshot(path=str(where / "node-block-form.png"))
    page.get_by_role("button", name="Block").click()
    assert "Node blocked" in page.get_by_role("status").inner_text()
    node = shown(cli, files, node_id)
    assert (node["state"], node["reason"]) == ("blocked", "lost laptop")
    logged = cli("audit", "list", "--target", f"node:{node_id}", "--json", env=files.cli_env)
    latest = logged.json()[0]
    assert latest["action"] == "node.block"
    assert latest["actor"] == {"kind": "ui", "name": "admin"}
    assert latest["details"] == {"reason": "lost laptop", "was": "accepted"}
    assert offered(page) == {"Unblock", "Delete", "Purge"}
    history = page.get_by_role("region", name="Audit history")
    newest = history.get_by_role("row").nth(1).locator("td").all_inner_texts()
    assert newest[1:3] == ["ui:admin", "node.block"]
    page.screenshot(path=str(where / "node-blocked.png"), full_page=True)
    agent.wait_status(lambda s: s.get("runtime") == "stopped", timeout=30)

    page.get_by_role("button", name="Unblock").click()
    assert "Node unblocked" in page.get_by_role("status").inner_text()
    assert shown(cli, files, node_id)["state"] == "accepted"
    assert actions_of(conn, node_id)[-1] == ("ui", "admin", "node.unblock")
    agent.wait_status(lambda s: s.get("runtime") == "running", timeout=60)

    # Purge asks first in a <dialog>; Cancel changes nothing.
    page.get_by_role("button", name="Purge").click()
    dialog = page.get_by_role("dialog", name=f"Purge node {node_id}?")
    assert dialog.is_visible() and "cannot be undone" in dialog.inner_text()
    assert dialog.evaluate("d => d.tagName === 'DIALOG' && d.open")
    confirm = dialog.get_by_role("button", name="Purge")
    field = dialog.get_by_label("Type the node's ID")
    assert confirm.is_disabled()
    field.fill(node_id)
    dialog.get_by_role("button", name="Cancel").click()
    assert not dialog.is_visible()
    assert state_of(conn, node_id) == "accepted"
    assert "node.purge" not in [a for _, _, a in actions_of(conn, node_id)]

    page.get_by_role("button", name="Purge").click()
    assert field.input_value() == ""  # what was typed before Cancel went with it
    assert confirm.is_disabled()
    for almost in (node_id[:-1], node_id + "0", node_id.upper(), " " + node_id):
        field.fill(almost)
        assert confirm.is_disabled(), almost
    field.fill(node_id)
    assert confirm.is_enabled()
    page.screenshot(path=str(where / "node-purge-dialog.png"))  # the viewport, as seen
    confirm.click()
    page.wait_for_url(re.compile(r"done=node\.purging"))
    assert agent.wait_exit(60) == 0, agent.log()
    assert not agent.data_dir.exists()
    assert cli("node", "show", node_id, env=files.cli_env).code == 1  # forgotten
    assert [a for a in actions_of(conn, node_id) if a[2].startswith("node.purge")] == [
        ("ui", "admin", "node.purge"),
        ("node", node_id, "node.purged"),
    ]


def test_delete_asks_first_and_the_server_checks_the_typed_id_of_a_purge(
    files: ClusterFiles, conn: Conn, page: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    doomed = joined_node(conn, hostname="old-box")
    kept = joined_node(conn, hostname="kept-box", labels={"role": "db"})

    page.goto(f"{BASE}/nodes/{doomed}")
    page.get_by_role("button", name="Delete").click()
    dialog = page.get_by_role("dialog", name=f"Delete node {doomed}?")
    assert "audit history stays" in dialog.inner_text()
    page.screenshot(path=str(where / "node-delete-dialog.png"))
    dialog.get_by_role("button", name="Cancel").click()
    assert not dialog.is_visible() and state_of(conn, doomed) == "accepted"
    page.get_by_role("button", name="Delete").click()
    dialog.get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{BASE}/nodes?done=node.deleted")
    assert "Node deleted" in page.get_by_role("status").inner_text()
    assert state_of(conn, doomed) is None
    assert actions_of(conn, doomed) == [("ui", "admin", "node.delete")]
    assert page.locator(f"tr[data-node={kept}]").is_visible()
    page.goto(f"{BASE}/nodes/{doomed}")
    assert page.get_by_role("heading", name="Not found").is_visible()

    # A post that skips the page: signed in with curl, with the session's CSRF token.
    jar = str(tmp_path / "cookies")
    credentials = f"username=admin&password={files.ui_password}"
    signed_in = curl("-c", jar, "-o", "/dev/null", "-w", "%{http_code}", "-H", f"Origin: {BASE}",
                     "-d", credentials, f"{BASE}/sign-in")  # fmt: skip
    assert signed_in.stdout == "303"
    token = re.search(
        r'name="csrf" value="([^"]+)"', curl("-b", jar, f"{BASE}/nodes/{kept}").stdout
    )
    assert token is not None

    def purge(*fields: str) -> tuple[str, str]:
        body = "&".join([f"csrf={token[1]}", *fields])
        done = curl("-b", jar, "-w", "\n%{http_code}", "-H", f"Origin: {BASE}", "-d", body,
                    f"{BASE}/nodes/{kept}/purge")  # fmt: skip
        text, _, code = done.stdout.rpartition("\n")
        return code, text

    for fields in ((f"confirm={doomed}",), ("confirm=",), (), (f"confirm={kept}%20",)):
        code, text = purge(*fields)
        assert code == "400", fields
        assert "Nothing was purged" in text, fields
        assert state_of(conn, kept) == "accepted", fields
    assert actions_of(conn, kept) == []
    code, _ = purge(f"confirm={kept}")
    assert code == "303" and state_of(conn, kept) == "purging"
    assert actions_of(conn, kept) == [("ui", "admin", "node.purge")]


def test_without_javascript_delete_and_purge_ask_on_pages_of_their_own(
    files: ClusterFiles, conn: Conn, browser: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    purged, deleted = (
        joined_node(conn, hostname="purge-me"),
        joined_node(conn, hostname="delete-me"),
    )
    context = browser.new_context(ignore_https_errors=True, java_script_enabled=False)
    page = context.new_page()
    sign_in(page, SERVER, files.ui_password)
    page.wait_for_url(f"{BASE}/overview")

    page.goto(f"{BASE}/nodes/{purged}")
    no_inline_code(page.content())
    page.get_by_role("button", name="Purge").click()
    page.wait_for_url(f"{BASE}/nodes/{purged}/purge?")  # a GET form with no fields
    assert page.get_by_role("heading", name=f"Purge node {purged}?").is_visible()
    assert "cannot be undone" in page.inner_text("main")
    no_inline_code(page.content())
    page.screenshot(path=str(where / "node-purge-page.png"), full_page=True)
    page.get_by_role("link", name="Cancel").click()
    page.wait_for_url(f"{BASE}/nodes/{purged}")
    assert state_of(conn, purged) == "accepted"

    page.get_by_role("button", name="Purge").click()
    page.get_by_label("Type the node's ID").fill(deleted)  # another node's ID
    page.get_by_role("button", name="Purge").click()
    assert "not this node's ID" in page.get_by_role("alert").inner_text()
    assert state_of(conn, purged) == "accepted"
    page.screenshot(path=str(where / "node-purge-page-refused.png"), full_page=True)
    page.get_by_label("Type the node's ID").fill(purged)
    page.get_by_role("button", name="Purge").click()
    page.wait_for_url(f"{BASE}/nodes/{purged}?done=node.purging")
    assert state_of(conn, purged) == "purging"
    assert offered(page) == {"Delete"}  # purging: no second purge

    page.goto(f"{BASE}/nodes/{deleted}")
    page.get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{BASE}/nodes/{deleted}/delete?")
    assert "audit history stays" in page.inner_text("main")
    page.screenshot(path=str(where / "node-delete-page.png"), full_page=True)
    page.get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{BASE}/nodes?done=node.deleted")
    assert state_of(conn, deleted) is None
    context.close()


def test_the_list_filters_searches_and_pages_in_the_url(
    files: ClusterFiles, conn: Conn, page: Any, tmp_path: Path
) -> None:
    where = shots(tmp_path)
    page.goto(f"{BASE}/nodes")
    empty = page.get_by_role("heading", name="No nodes yet")
    assert empty.is_visible()
    assert files.ca_hash in page.inner_text("main") and "token create" in page.inner_text("main")
    page.screenshot(path=str(where / "nodes-empty.png"), full_page=True)

    with conn.transaction():
        tenants.create(conn, "acme", audit.Actor("operator", "admin"))
    web = []
    for i in range(60):  # oldest first, as listed
        state = "blocked" if i % 12 == 5 else "accepted"
        labels = {"role": "web" if i % 2 == 0 else "db", "zone": f"z{i % 3}"}
        web.append(joined_node(conn, state=state, hostname=f"web-{i:02d}", labels=labels,
                            joined_ago=1000 - i))  # fmt: skip
    acme = [
        joined_node(conn, state="pending", tenant="acme", hostname=f"acme-{i}", joined_ago=10 - i)
        for i in range(4)
    ]
    total = len(web) + len(acme)

    def listed() -> list[str]:
        return [r.get_attribute("data-node") for r in page.locator("tr[data-node]").all()]

    page.goto(f"{BASE}/nodes")
    assert listed() == web[: paging.ROWS]
    assert f"Showing 1–50 of {total}" in page.inner_text("main")
    first = page.locator("tr[data-node]").first
    assert "web-00" in first.inner_text() and "role=web" in first.inner_text()
    no_inline_code(page.content())
    page.screenshot(path=str(where / "nodes.png"), full_page=True)
    page.get_by_role("link", name="Next →").click()
    page.wait_for_url(f"{BASE}/nodes?page=2")
    assert listed() == [*web[50:], *acme]
    page.get_by_role("link", name="← Previous").click()
    page.wait_for_url(f"{BASE}/nodes")

    page.get_by_label("Tenant").select_option("acme")
    page.get_by_role("button", name="Filter").click()
    page.wait_for_url(f"{BASE}/nodes?tenant=acme")  # the blank filters left out
    assert listed() == acme

    page.goto(f"{BASE}/nodes?state=blocked")
    assert listed() == [n for i, n in enumerate(web) if i % 12 == 5]
    assert page.get_by_label("State").input_value() == "blocked"
    page.goto(f"{BASE}/nodes?label=zone%3Dz1&state=accepted")
    assert listed() == [n for i, n in enumerate(web) if i % 3 == 1 and i % 12 != 5]
    page.goto(f"{BASE}/nodes?label=zone")
    assert listed() == web[:50]  # KEY alone: any value
    page.goto(f"{BASE}/nodes?q=WEB-07")
    assert listed() == [web[7]]
    page.goto(f"{BASE}/nodes?q={acme[2][-7:]}")
    assert listed() == [acme[2]]

    # Paging keeps the filters.
    page.goto(f"{BASE}/nodes?q=web&label=role%3Dweb")
    assert listed() == web[0::2]
    page.goto(f"{BASE}/nodes?q=-&state=accepted")
    accepted = [n for i, n in enumerate(web) if i % 12 != 5]
    assert listed() == accepted[:50]
    page.get_by_role("link", name="Next →").click()
    page.wait_for_url(f"{BASE}/nodes?q=-&state=accepted&page=2")
    assert listed() == accepted[50:]
    page.goto(f"{BASE}/nodes?page=9")
    assert page.get_by_role("heading", name="No nodes on this page").is_visible()

    for literal in ("%25", "_"):  # searched for as they are, not as patterns
        page.goto(f"{BASE}/nodes?q={literal}")
        assert listed() == [], literal
    page.goto(f"{BASE}/nodes?q=no-such-host")
    assert page.get_by_role("heading", name="No nodes match").is_visible()
    assert page.get_by_role("link", name="Clear the filters").get_attribute("href") == "/nodes"
    response = page.goto(f"{BASE}/nodes?label=%3Dweb")
    assert response.status == 400
    assert "invalid label filter" in page.get_by_role("alert").inner_text()

    page.goto(f"{BASE}/nodes")
    page.get_by_role("link", name=web[3]).click()
    page.wait_for_url(f"{BASE}/nodes/{web[3]}")
    assert "web-03" in page.get_by_role("region", name="Details").inner_text()


def test_the_node_page_shows_every_field_and_the_jobs_that_ran_there(
    files: ClusterFiles, conn: Conn, page: Any, tmp_path: Path
) -> None:
    node_id = joined_node(
        conn, state="blocked", hostname="db-7", labels={"role": "db", "os": "linux"}
    )
    conn.execute("UPDATE nodes SET reason = 'disk failing' WHERE id = %s", (node_id,))
    job_id = "job-" + secrets.token_hex(6)
    # A job that ran there, finished: no workflow to start (workflow_started).
    conn.execute(
        "INSERT INTO jobs (id, tenant, name, command, queue_timeout_s, created_by, state,"
        " exit_code, workflow_started, started_at, ended_at)"
        " VALUES (%s, 'default', 'backup', %s, 60, 'operator:admin', 'succeeded', 0, true,"
        " now(), now())",
        (job_id, Jsonb(["pg_dump", "app"])),
    )
    conn.execute(
        "INSERT INTO job_attempts (job_id, number, node_id, state, ended_at, exit_code,"
        " ended_because) VALUES (%s, 1, %s, 'ended', now(), 0, 'exit')",
        (job_id, node_id),
    )
    page.goto(f"{BASE}/nodes/{node_id}")
    details = page.get_by_role("region", name="Details").inner_text()
    for text in (node_id, "blocked", "disk failing", "default", "os=linux", "role=db", "db-7"):
        assert text in details, text
    assert "disconnected" in details and "never" in details  # never seen
    assert page.locator("[data-node-reload]").get_attribute("data-node") == node_id
    jobs = page.get_by_role("region", name="Jobs")
    assert jobs.get_by_role("link", name="backup").get_attribute("href") == f"/jobs/{job_id}"
    assert "pg_dump app" in jobs.inner_text() and "exit 0" in jobs.inner_text()
    assert offered(page) == {"Unblock", "Delete", "Purge"}
    no_inline_code(page.content())
    page.screenshot(path=str(shots(tmp_path) / "node-with-jobs.png"), full_page=True)

    # Blocked while pending: never accepted, so no control stream to purge it through.
    never = joined_node(conn, state="pending")
    conn.execute("UPDATE nodes SET state = 'blocked', reason = 'x' WHERE id = %s", (never,))
    page.goto(f"{BASE}/nodes/{never}")
    assert offered(page) == {"Unblock", "Delete"}
    page.goto(f"{BASE}/nodes/{never}/purge")
    assert "cannot be purged now" in page.inner_text("main")
    assert page.goto(f"{BASE}/nodes/node-000000000000").status == 404

    stranger = joined_node(conn, state="pending", hostname="stranger")
    page.goto(f"{BASE}/nodes/{stranger}")
    page.get_by_label("Reason for rejecting (optional)").fill("not one of ours")
    page.get_by_role("button", name="Reject").click()
    assert "Node rejected" in page.get_by_role("status").inner_text()
    row = conn.execute("SELECT state, reason FROM nodes WHERE id = %s", (stranger,)).fetchone()
    assert row == ("rejected", "not one of ours")
    assert actions_of(conn, stranger) == [("ui", "admin", "node.reject")]
    assert offered(page) == {"Delete"}
