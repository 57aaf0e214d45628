"""The web UI by role, in Debian's chromium (Playwright) against one real server on
127.0.0.130: each person signs in as itself, its pages show no button, link or form for
what its role may not do, and what it forges anyway is refused 403 and changes nothing.

People are made as a test makes them before `operator add` exists (web_support.person).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from fixtures.cluster import ClusterFiles, Served, cli_command
from oz0.jobs import store
from oz0.jobs.spec import new_job_id
from tests.web_support import browser, person, shots, signed_in

__all__ = ["browser"]  # the fixture, used by name

ADDRESS = "127.0.0.130"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
BASE = f"https://{ADDRESS}:8443"
OUTPUT = "the job's secret output"


@dataclass(frozen=True)
class World:
    """The module's cluster: its people's passwords, acme's node, job and join token."""

    files: ClusterFiles
    passwords: dict[str, str]
    node: str
    job: str
    token: str


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> World:
    files = served.files
    created = subprocess.run(
        cli_command("tenant", "create", "acme"), env={**os.environ, **files.cli_env},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    made = subprocess.run(
        cli_command("token", "create", "--tenant", "acme", "--json"),
        env={**os.environ, **files.cli_env}, capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    root = tmp_path_factory.mktemp("people")
    people = {
        "vera": person(files, root, "vera", "viewer", ["acme"]),
        "otto": person(files, root, "otto", "operator", ["acme"]),
        "ada": person(files, root, "ada", "admin"),
    }
    node, job = "node-" + secrets.token_hex(6), new_job_id()
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nodes (id, tenant, state, public_key_sha256, certificate, joined_at)"
            " VALUES (%s, 'acme', 'accepted', %s, 'issued', now())",
            (node, secrets.token_hex(32)),
        )
        # A running job of acme's with some output, as if the node had sent it.
        conn.execute(
            "INSERT INTO jobs (id, tenant, command, queue_timeout_s, created_by, state,"
            " started_at, workflow_started) VALUES (%s, 'acme', %s, 600, 'operator:otto',"
            " 'running', now(), true)",
            (job, Jsonb(["sh", "-c", "echo secret"])),
        )
        conn.execute(
            "INSERT INTO job_attempts (job_id, number, node_id) VALUES (%s, 1, %s)", (job, node)
        )
        assert store.append_output(conn, node, job, 1, 0, "stdout", OUTPUT.encode(), False)
    return World(files, people, node, job, json.loads(made.stdout)["id"])


def actions_on(page: Any, path: str) -> dict[str, list[str]]:
    """What PATH offers to change things: its post forms' actions (sign-out aside), and its
    links to the forms that make or ask before changing."""
    page.goto(f"{BASE}{path}")
    forms = page.locator("form[method=post]").evaluate_all(
        "fs => fs.map(f => f.getAttribute('action'))"
    )
    gets = page.locator("form[method=get][action*='/nodes/'], form[data-revoke]").evaluate_all(
        "fs => fs.map(f => f.getAttribute('action'))"
    )
    links = page.locator("a[href$='/new']").evaluate_all(
        "ls => ls.map(l => l.getAttribute('href'))"
    )
    return {
        "posts": sorted(a for a in forms if a != "/sign-out"),
        "asks": sorted(gets),
        "new": sorted(set(links)),
    }


def forged(page: Any, path: str, **fields: str) -> int:
    """A post to PATH from the page's own origin with the session's CSRF token, as a person
    would forge one in the browser's console: the status the server answers."""
    csrf = page.locator("input[name=csrf]").first.get_attribute("value")
    return int(
        page.evaluate(
            """async ([path, body]) => (await fetch(path, {method: "POST",
                 body: new URLSearchParams(body), redirect: "manual"})).status""",
            [path, {"csrf": csrf, **fields}],
        )
    )


def audited(files: ClusterFiles, action: str) -> list[tuple[str, str]]:
    with psycopg.connect(files.main_db) as conn:
        rows = conn.execute(
            "SELECT actor_kind || ':' || actor, target FROM audit_log WHERE action = %s"
            " ORDER BY id",
            (action,),
        ).fetchall()
    return [(r[0], r[1]) for r in rows]


def node_state(files: ClusterFiles, node: str) -> str:
    with psycopg.connect(files.main_db) as conn:
        row = conn.execute("SELECT state FROM nodes WHERE id = %s", (node,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.slow
def test_a_viewer_of_acme_sees_no_action_and_its_forged_posts_are_refused(
    world: World, browser: Any, tmp_path: Path
) -> None:
    page = signed_in(browser, ADDRESS, world.passwords["vera"], username="vera")
    where = shots(tmp_path)
    nothing: dict[str, list[str]] = {"posts": [], "asks": [], "new": []}
    for name, path in [
        ("nodes", "/nodes"), ("node", f"/nodes/{world.node}"), ("jobs", "/jobs"),
        ("job", f"/jobs/{world.job}"), ("tokens", "/tokens"), ("tenants", "/tenants"),
    ]:  # fmt: skip
        assert actions_on(page, path) == nothing, path
        page.screenshot(path=str(where / f"viewer-{name}.png"), full_page=True)

    # Its job page shows no output and does not follow the job (jobs.js polls output).
    page.goto(f"{BASE}/jobs/{world.job}")
    assert OUTPUT not in page.content()
    assert page.locator("script[src$='jobs.js']").count() == 0
    assert page.locator("[data-field=no-output-right]").inner_text() == (
        "A viewer does not see job output."
    )
    # Asked for anyway, live.json gives the job's state and none of its output.
    live = page.evaluate(
        "async (path) => await (await fetch(path)).json()", f"/jobs/{world.job}/live.json"
    )
    assert (live["state"], live["chunks"]) == ("running", [])
    page.goto(f"{BASE}/account")
    assert page.locator("[data-field=role]").inner_text() == "viewer"
    assert page.locator("[data-field=tenants]").inner_text() == "acme"

    # Posts it forges with its own valid token: refused, nothing changed, nothing audited.
    blocks, cancels = audited(world.files, "node.block"), audited(world.files, "job.cancel")
    assert forged(page, f"/nodes/{world.node}/block", reason="forged") == 403
    assert "may not block nodes" in page.evaluate(
        """async (path) => (await fetch(path, {method: "POST", body: new URLSearchParams(
             {csrf: document.querySelector("input[name=csrf]").value, reason: "x"})})).text()""",
        f"/nodes/{world.node}/block",
    )
    assert forged(page, f"/jobs/{world.job}/cancel") == 403
    assert forged(page, "/jobs", command="uptime", tenant="acme") == 403
    assert forged(page, "/tenants", name="forged") == 403
    assert forged(page, "/tokens", tenant="acme", ttl="1h", max_uses="1") == 403
    assert forged(page, f"/tokens/{world.token}/revoke") == 403
    assert forged(page, f"/nodes/{world.node}/delete") == 403
    assert node_state(world.files, world.node) == "accepted"
    assert audited(world.files, "node.block") == blocks
    assert audited(world.files, "job.cancel") == cancels
    with psycopg.connect(world.files.main_db) as conn:
        live_tokens = conn.execute("SELECT count(*) FROM join_tokens WHERE revoked_at IS NULL")
        assert live_tokens.fetchone() == (1,)


@pytest.mark.slow
def test_an_operator_of_acme_sees_run_block_and_tokens_but_not_delete_purge_or_tenants(
    world: World, browser: Any, tmp_path: Path
) -> None:
    page = signed_in(browser, ADDRESS, world.passwords["otto"], username="otto")
    where = shots(tmp_path)
    node = actions_on(page, f"/nodes/{world.node}")
    page.screenshot(path=str(where / "operator-node.png"), full_page=True)
    assert node["posts"] == [f"/nodes/{world.node}/block"]
    assert node["asks"] == []  # no delete, no purge
    assert actions_on(page, "/jobs")["new"] == ["/jobs/new"]
    job = actions_on(page, f"/jobs/{world.job}")
    assert job["posts"] == [f"/jobs/{world.job}/cancel"]
    assert OUTPUT in page.locator("[data-field=output]").inner_text()
    assert page.locator("script[src$='jobs.js']").count() == 1
    page.screenshot(path=str(where / "operator-job.png"), full_page=True)
    tokens = actions_on(page, "/tokens")
    assert tokens["new"] == ["/tokens/new"]
    assert tokens["asks"] == [f"/tokens/{world.token}/revoke"]
    assert tokens["posts"] == ["/tokens"]  # the dialog Revoke… opens
    assert actions_on(page, "/tenants")["posts"] == []  # cluster-wide admins only
    assert forged(page, f"/nodes/{world.node}/purge", confirm=world.node) == 403

    # What it may do, it does in its own name.
    page.goto(f"{BASE}/nodes/{world.node}")
    page.get_by_label("Reason").fill("seen by otto")
    page.get_by_role("button", name="Block").click()
    page.wait_for_url(f"{BASE}/nodes/{world.node}?done=*")
    assert node_state(world.files, world.node) == "blocked"
    assert audited(world.files, "node.block")[-1] == ("ui:otto", f"node:{world.node}")
    page.goto(f"{BASE}/nodes/{world.node}")
    page.get_by_role("button", name="Unblock").click()
    page.wait_for_url(f"{BASE}/nodes/{world.node}?done=*")
    assert node_state(world.files, world.node) == "accepted"


@pytest.mark.slow
def test_the_admin_sees_delete_purge_and_create_tenant(
    world: World, browser: Any, tmp_path: Path
) -> None:
    page = signed_in(browser, ADDRESS, world.passwords["ada"], username="ada")
    node = actions_on(page, f"/nodes/{world.node}")
    page.screenshot(path=str(shots(tmp_path) / "admin-node.png"), full_page=True)
    assert node["posts"] == sorted(
        [f"/nodes/{world.node}/block", f"/nodes/{world.node}/delete",
         f"/nodes/{world.node}/purge"]
    )  # fmt: skip
    assert node["asks"] == [f"/nodes/{world.node}/delete", f"/nodes/{world.node}/purge"]
    assert actions_on(page, "/tenants")["posts"] == ["/tenants"]
    assert page.get_by_role("button", name="Create tenant").is_visible()
    assert audited(world.files, "ui.login")[-1] == ("ui:ada", "ui:ada")


# How far the page is wider than the window (px), and what is cut: a box whose content is
# wider than it and hidden (not text for screen readers only, clipped to 1 px on purpose).
# What is wider than the window must scroll inside its own box (a table of nodes or jobs,
# inside its card), never the page, and nothing may be cut.
OVERFLOW = """() => {
  const page = document.documentElement;
  const cut = [...document.querySelectorAll("main *")].filter((e) =>
    e.clientWidth > 1 && e.scrollWidth > e.clientWidth + 1 &&
    ["hidden", "clip"].includes(getComputedStyle(e).overflowX)
  ).map((e) => e.tagName + "." + e.className);
  return { page: page.scrollWidth - page.clientWidth, cut: cut };
}"""


@pytest.mark.slow
@pytest.mark.parametrize("width", [1280, 1920])
def test_every_page_fits_the_window_for_a_viewer_and_an_admin(
    world: World, browser: Any, tmp_path: Path, width: int
) -> None:
    pages = ["/overview", "/nodes", f"/nodes/{world.node}", "/jobs", f"/jobs/{world.job}",
             "/tokens", "/schedules", "/sessions", "/audit", "/account"]  # fmt: skip
    wider: dict[str, Any] = {}
    for name, extra in (("vera", []), ("ada", ["/tenants", "/servers"])):
        page = signed_in(browser, ADDRESS, world.passwords[name], username=name)
        page.set_viewport_size({"width": width, "height": 800})
        for path in pages + extra:
            page.goto(f"{BASE}{path}")
            found = page.evaluate(OVERFLOW)
            if found["page"] > 0 or found["cut"]:
                wider[f"{name} {path}"] = found
                page.screenshot(path=str(shots(tmp_path) / f"wide-{name}-{width}.png"))
        page.context.close()
    assert not wider, f"wider than {width} px: {wider}"
