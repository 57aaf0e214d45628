"""Tenant scope (issue 28): a person with tenants listed sees and changes only their objects,
through the CLI, the JSON API and the web UI of one real server on 127.0.0.120.

The cluster has tenants `default` and `acme`, each with nodes joined by the simulated node
(fixtures/edge_client.py) with a token of its own, and a job; `carol` is a viewer of acme
and `bob` an operator of acme, both made by `server operator issue` and then scoped.
Another tenant's node, job or token is answered as not found, in the same words as an
unknown ID; making something in another tenant is refused in one line.
"""

from __future__ import annotations

import http.client
import json
import re
import shutil
import ssl
import subprocess
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from cli import client
from fixtures import edge_client
from fixtures.cluster import ClusterFiles, Served
from fixtures.polling import wait_until
from oz0 import listing
from oz0.context import Context
from tests.conftest import CliRunner
from tests.web_support import person

ADDRESS = "127.0.0.120"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{ADDRESS}:7443"
TENANTS = ("default", "acme")
NODES_EACH = 2
WEB_PASSWORD = "a long enough web password"


@dataclass(frozen=True)
class World:
    files: ClusterFiles
    admin: dict[str, str]  # the CLI's environment of each person
    carol: dict[str, str]  # viewer of acme
    bob: dict[str, str]  # operator of acme
    nodes: dict[str, list[str]]  # by tenant
    pending: str  # a node of default that joined without a token
    tokens: dict[str, str]  # a token's ID, by tenant
    jobs: dict[str, str]  # a job's ID, by tenant


def api(env: dict[str, str], method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request with ENV's operator certificate: the status and the decoded answer."""
    ctx = Context.load(Path(env["OZ0_CONTEXT"]))
    tls = ssl.create_default_context(cafile=str(ctx.ca_path))
    tls.check_hostname = False
    tls.load_cert_chain(str(ctx.cert_path), str(ctx.key_path))
    https = client.connection(ADDRESS, 8443, tls, timeout=10)
    try:
        data = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        https.request(method, path, body=data, headers=headers)
        answer = https.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        https.close()


def ok(env: dict[str, str], method: str, path: str, body: Any = None) -> Any:
    status, answer = api(env, method, path, body)
    assert status < 300, (status, answer)
    return answer


def operator_env(
    files: ClusterFiles, root: Path, name: str, role: str, tenants: list[str]
) -> dict[str, str]:
    """Operator NAME with ROLE in TENANTS and a web account (`person`): its CLI environment."""
    person(files, root, name, role, tenants, password=WEB_PASSWORD)
    return {**files.cli_env, "OZ0_CONTEXT": str(root / name / "context.json")}


async def join_nodes(files: ClusterFiles, token: str | None, tenant: str, count: int) -> list[str]:
    """COUNT nodes joined with TOKEN (accepted in its tenant), or without one (pending)."""
    ca_pem = Context.load(files.context_path).ca_path.read_bytes()
    joined = []
    for i in range(count):
        keys = edge_client.NodeKeys.new()
        keys.ca_pem = ca_pem
        answer = await edge_client.join(
            EDGE, keys, token=token, labels={"role": "web"}, hostname=f"{tenant}-{i}"
        )
        assert answer.get("state") == ("pending" if token is None else "accepted"), answer
        joined.append(keys.node_id)
    return joined


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> World:
    files = served.files
    admin = files.cli_env
    ok(admin, "POST", "/api/v1/tenants", {"name": "acme"})
    found: dict[str, list[str]] = {}
    tokens: dict[str, str] = {}
    jobs: dict[str, str] = {}
    for tenant in TENANTS:
        made = ok(admin, "POST", "/api/v1/tokens", {"tenant": tenant, "max_uses": 0})
        tokens[tenant] = made["id"]
        found[tenant] = trio.run(join_nodes, files, made["token"], tenant, NODES_EACH)
        job = {"tenant": tenant, "command": ["true"], "queue_timeout": 3600}
        jobs[tenant] = ok(admin, "POST", "/api/v1/jobs", job)["id"]
    [pending] = trio.run(join_nodes, files, None, "default", 1)
    root = tmp_path_factory.mktemp("people")
    return World(
        files, admin, operator_env(files, root, "carol", "viewer", ["acme"]),
        operator_env(files, root, "bob", "operator", ["acme"]), found, pending, tokens, jobs,
    )  # fmt: skip


def listed(cli: CliRunner, env: dict[str, str], *args: str) -> Any:
    done = cli(*args, "--json", env=env)
    assert done.code == 0, done.err
    return done.json()


def refused(cli: CliRunner, env: dict[str, str], *args: str) -> str:
    """The one line a refused command prints (it exits non-zero)."""
    done = cli(*args, env=env)
    assert done.code != 0, done.out
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done.err
    return lines[0]


# --- listings -------------------------------------------------------------------------


def test_a_viewer_of_acme_lists_only_acmes_nodes(cli: CliRunner, world: World) -> None:
    acme = sorted(world.nodes["acme"])
    assert sorted(n["id"] for n in listed(cli, world.carol, "node", "list")) == acme
    assert sorted(n["id"] for n in ok(world.carol, "GET", "/api/v1/nodes")["nodes"]) == acme
    # Asked for the other tenant outright: nothing of it.
    assert ok(world.carol, "GET", "/api/v1/nodes?tenant=default")["nodes"] == []
    everything = sorted([*world.nodes["acme"], *world.nodes["default"], world.pending])
    assert sorted(n["id"] for n in listed(cli, world.admin, "node", "list")) == everything


def test_a_viewer_of_acme_lists_only_acmes_tokens(cli: CliRunner, world: World) -> None:
    assert [t["id"] for t in listed(cli, world.carol, "token", "list")] == [world.tokens["acme"]]
    api_tokens = ok(world.carol, "GET", "/api/v1/tokens")["tokens"]
    assert [t["id"] for t in api_tokens] == [world.tokens["acme"]]


def test_a_viewer_of_acme_lists_only_acmes_jobs(cli: CliRunner, world: World) -> None:
    assert [j["id"] for j in listed(cli, world.carol, "job", "list")] == [world.jobs["acme"]]
    api_jobs = ok(world.carol, "GET", "/api/v1/jobs")["jobs"]
    assert [j["id"] for j in api_jobs] == [world.jobs["acme"]]
    assert ok(world.carol, "GET", "/api/v1/jobs?tenant=default")["jobs"] == []


def test_a_viewer_of_acme_lists_only_acme_as_its_tenant(cli: CliRunner, world: World) -> None:
    assert [t["name"] for t in listed(cli, world.carol, "tenant", "list")] == ["acme"]
    assert [t["name"] for t in ok(world.carol, "GET", "/api/v1/tenants")["tenants"]] == ["acme"]
    assert [t["name"] for t in listed(cli, world.admin, "tenant", "list")] == ["acme", "default"]


def test_a_viewer_of_acme_reads_only_audit_rows_about_acme(cli: CliRunner, world: World) -> None:
    rows = listed(cli, world.carol, "audit", "list")
    entries = ok(world.carol, "GET", "/api/v1/audit?limit=1000")["entries"]
    assert [e["id"] for e in rows] == [e["id"] for e in entries]
    acme_objects = {
        "tenant:acme", f"token:{world.tokens['acme']}", f"job:{world.jobs['acme']}",
        *(f"node:{n}" for n in world.nodes["acme"]),
    }  # fmt: skip
    assert {e["target"] for e in entries} == acme_objects
    # The admin sees the rest: the other tenant's rows and the cluster's own.
    every = {e["target"] for e in ok(world.admin, "GET", "/api/v1/audit?limit=1000")["entries"]}
    assert {"cluster:test", "tenant:default", f"job:{world.jobs['default']}"} <= every
    assert {f"node:{n}" for n in [*world.nodes["default"], world.pending]} <= every


def test_audit_rows_name_the_tenant_they_are_about(world: World) -> None:
    with psycopg.connect(world.files.url.conninfo) as conn:
        rows = conn.execute(
            "SELECT action, target, tenants FROM audit_log WHERE action IN"
            " ('node.join', 'token.create', 'job.run', 'tenant.create', 'cluster.init')"
        ).fetchall()
    tenant_of = {f"node:{n}": t for t in TENANTS for n in world.nodes[t]}
    tenant_of[f"node:{world.pending}"] = "default"
    tenant_of |= {f"token:{world.tokens[t]}": t for t in TENANTS}
    tenant_of |= {f"job:{world.jobs[t]}": t for t in TENANTS}
    tenant_of |= {f"tenant:{t}": t for t in TENANTS}
    for action, target, tenants in rows:
        wanted = [tenant_of[target]] if action != "cluster.init" else []
        assert tenants == wanted, (action, target)


# --- one object of another tenant: not found ------------------------------------------


def test_node_show_of_another_tenants_node_reads_as_an_unknown_one(
    cli: CliRunner, world: World
) -> None:
    theirs = world.nodes["default"][0]
    assert refused(cli, world.carol, "node", "show", theirs) == f"error: node {theirs} not found"
    unknown = "node-000000000000"
    assert refused(cli, world.carol, "node", "show", unknown) == f"error: node {unknown} not found"
    assert api(world.carol, "GET", f"/api/v1/nodes/{theirs}") == (
        404, {"error": f"node {theirs} not found"}
    )  # fmt: skip
    mine = world.nodes["acme"][0]
    assert listed(cli, world.carol, "node", "show", mine)["id"] == mine


def test_job_show_and_output_of_another_tenants_job_read_as_unknown(
    cli: CliRunner, world: World
) -> None:
    theirs = world.jobs["default"]
    assert refused(cli, world.carol, "job", "show", theirs) == f"error: job {theirs} not found"
    status, _ = api(world.bob, "GET", f"/api/v1/jobs/{theirs}/output")
    assert status == 404
    assert api(world.bob, "GET", f"/api/v1/jobs/{world.jobs['acme']}/output")[0] == 200
    assert listed(cli, world.carol, "job", "show", world.jobs["acme"])["id"] == world.jobs["acme"]


# --- refusals ------------------------------------------------------------------------------


def test_a_viewer_is_refused_a_job_run_and_a_block(cli: CliRunner, world: World) -> None:
    mine = world.nodes["acme"][0]
    assert refused(
        cli, world.carol, "job", "run", "--tenant", "acme", "--detach", "--", "true"
    ) == ("error: operator carol (viewer of acme) may not run jobs")
    assert refused(cli, world.carol, "node", "block", mine, "--reason", "test") == (
        "error: operator carol (viewer of acme) may not block nodes"
    )


def test_an_acme_operator_runs_a_job_in_acme_and_is_refused_in_default(
    cli: CliRunner, world: World
) -> None:
    def run(tenant: str) -> tuple[str, ...]:
        return ("job", "run", "--tenant", tenant, "--detach", "--json", "--queue-timeout", "1h",
                "--", "true")  # fmt: skip

    done = cli(*run("acme"), env=world.bob)
    assert done.code == 0, done.err
    assert done.json()["tenant"] == "acme"
    assert refused(cli, world.bob, *run("default")) == (
        "error: operator bob (operator of acme) may not run jobs in tenant default"
    )
    status, answer = api(
        world.bob, "POST", "/api/v1/jobs", {"tenant": "default", "command": ["true"]}
    )
    assert (status, answer) == (
        403, {"error": "operator bob (operator of acme) may not run jobs in tenant default"}
    )  # fmt: skip


def test_an_acme_operator_cannot_cancel_another_tenants_job(cli: CliRunner, world: World) -> None:
    theirs = world.jobs["default"]
    assert refused(cli, world.bob, "job", "cancel", theirs) == f"error: job {theirs} not found"
    assert listed(cli, world.admin, "job", "show", theirs)["state"] != "cancelled"


def test_an_acme_operator_creates_tokens_only_in_acme_and_revokes_only_acmes(
    cli: CliRunner, world: World
) -> None:
    assert refused(cli, world.bob, "token", "create", "--tenant", "default") == (
        "error: operator bob (operator of acme) may not create join tokens in tenant default"
    )
    made = listed(cli, world.bob, "token", "create", "--tenant", "acme")
    assert made["tenant"] == "acme"
    theirs = world.tokens["default"]
    assert refused(cli, world.bob, "token", "revoke", theirs) == f"error: token {theirs} not found"
    assert not listed(cli, world.admin, "token", "list")[0]["revoked"]
    revoked = ok(world.bob, "POST", f"/api/v1/tokens/{made['id']}/revoke", {})
    assert revoked["revoked"]


def test_an_acme_operator_changes_only_acmes_nodes(cli: CliRunner, world: World) -> None:
    theirs, mine = world.nodes["default"][0], world.nodes["acme"][0]
    # One node of another tenant: not found, by ID alone or among others.
    for args in ((theirs,), (mine, theirs)):
        line = refused(cli, world.bob, "node", "block", *args, "--reason", "scope test")
        assert line.startswith(f"error: node {theirs} not found"), line
    assert api(world.bob, "POST", f"/api/v1/nodes/{theirs}/block", {"reason": "x"})[0] == 404
    # A pending node of another tenant: accept and reject would be allowed by its state.
    for action in ("accept", "reject"):
        assert api(world.bob, "POST", f"/api/v1/nodes/{world.pending}/{action}", {}) == (
            404, {"error": f"node {world.pending} not found"}
        )  # fmt: skip
    # A selector takes the person's tenants' nodes only; naming another tenant is refused.
    blocked = listed(cli, world.bob, "node", "block", "--selector", "role=web", "--reason", "t")
    assert sorted(n["id"] for n in blocked) == sorted(world.nodes["acme"])
    assert (
        refused(cli, world.bob, "node", "unblock", "--selector", "role=web", "--tenant", "default")
        == "error: operator bob (operator of acme) may not unblock nodes in tenant default"
    )
    unblocked = listed(cli, world.bob, "node", "unblock", "--selector", "role=web")
    assert sorted(n["id"] for n in unblocked) == sorted(world.nodes["acme"])
    states = {n["id"]: n["state"] for n in listed(cli, world.admin, "node", "list")}
    assert {states[n] for n in world.nodes["default"]} == {"accepted"}
    # The one-node block and unblock (written in batches) take the scope too.
    assert listed(cli, world.bob, "node", "block", mine, "--reason", "one")[0]["state"] == "blocked"
    assert listed(cli, world.bob, "node", "unblock", mine)[0]["state"] == "accepted"
    # And the audit rows of these changes are acme's: its viewer sees every row about the
    # node the admin sees (its join, two blocks and two unblocks).
    about = f"/api/v1/audit?target=node:{mine}"
    rows = [(e["id"], e["action"]) for e in ok(world.carol, "GET", about)["entries"]]
    assert rows == [(e["id"], e["action"]) for e in ok(world.admin, "GET", about)["entries"]]
    assert [a for _, a in rows] == [
        "node.unblock", "node.block", "node.unblock", "node.block", "node.join"
    ]  # fmt: skip


# --- the web UI ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def carol_web(world: World) -> str:
    """A session cookie of carol's web UI account, signed in as a browser does."""
    return session_cookie(world.files, "carol", WEB_PASSWORD)


def pruned_jobs(world: World) -> float:
    """The server's oz0_pruned_jobs_total."""
    https = _https(world.files)
    try:
        https.request("GET", "/metrics")
        metrics = https.getresponse().read().decode()
    finally:
        https.close()
    pruned = re.search(r"^oz0_pruned_jobs_total (\S+)$", metrics, re.M)
    assert pruned is not None, "no oz0_pruned_jobs_total"
    return float(pruned.group(1))


def _https(files: ClusterFiles) -> http.client.HTTPSConnection:
    ctx = Context.load(files.context_path)
    tls = ssl.create_default_context(cafile=str(ctx.ca_path))
    tls.check_hostname = False
    # The cluster CA's certificate, as our clients ask for it (browsers get the web UI's,
    # tests/test_ui_certificate.py): the pages are the same whichever a client gets.
    return client.connection(ADDRESS, 8443, tls, timeout=10)


def session_cookie(files: ClusterFiles, name: str, password: str) -> str:
    https = _https(files)
    try:
        https.request(
            "POST", "/sign-in", urllib.parse.urlencode({"username": name, "password": password}),
            {"Content-Type": "application/x-www-form-urlencoded", "Sec-Fetch-Site": "same-origin"},
        )  # fmt: skip
        answer = https.getresponse()
        answer.read()
        assert answer.status == 303, answer.status
        cookie = answer.getheader("Set-Cookie") or ""
    finally:
        https.close()
    return cookie.split(";", 1)[0]


def page(files: ClusterFiles, cookie: str, path: str) -> str:
    https = _https(files)
    try:
        https.request("GET", path, headers={"Cookie": cookie, "Accept": "text/html"})
        answer = https.getresponse()
        text = answer.read().decode()
        assert answer.status == 200, (answer.status, text[:500])
        return text
    finally:
        https.close()


def test_a_scoped_persons_web_node_list_shows_only_its_tenants_nodes(
    world: World, carol_web: str
) -> None:
    shown = page(world.files, carol_web, "/nodes")
    for node_id in world.nodes["acme"]:
        assert node_id in shown
    for node_id in world.nodes["default"]:
        assert node_id not in shown
    theirs = world.nodes["default"][0]
    https = _https(world.files)
    try:
        https.request("GET", f"/nodes/{theirs}", headers={"Cookie": carol_web})
        assert https.getresponse().status == 404
    finally:
        https.close()


def web_post(files: ClusterFiles, cookie: str, path: str, form: dict[str, str]) -> int:
    """FORM posted to PATH as the UI's own page posts it: the answer's status."""
    https = _https(files)
    try:
        https.request(
            "POST", path, urllib.parse.urlencode(form),
            {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded",
             "Sec-Fetch-Site": "same-origin"},
        )  # fmt: skip
        answer = https.getresponse()
        answer.read()
        return answer.status
    finally:
        https.close()


def test_a_scoped_persons_web_block_reaches_only_its_tenants_nodes(world: World) -> None:
    bob = session_cookie(world.files, "bob", WEB_PASSWORD)
    mine, theirs = world.nodes["acme"][1], world.nodes["default"][1]
    found = re.search(r'name="csrf" value="([^"]+)"', page(world.files, bob, f"/nodes/{mine}"))
    assert found is not None
    form = {"csrf": found.group(1), "reason": "from the web"}
    assert web_post(world.files, bob, f"/nodes/{theirs}/block", form) == 404
    assert web_post(world.files, bob, f"/nodes/{mine}/block", form) == 303
    assert web_post(world.files, bob, f"/nodes/{mine}/unblock", form) == 303
    states = {n["id"]: n["state"] for n in ok(world.admin, "GET", "/api/v1/nodes")["nodes"]}
    assert (states[mine], states[theirs]) == ("accepted", "accepted")
    # The web UI's block is audited as about the node's tenant: acme's viewer sees it.
    seen = ok(world.carol, "GET", f"/api/v1/audit?target=node:{mine}&actor=ui:bob")["entries"]
    assert [e["action"] for e in seen] == ["node.unblock", "node.block"]


def test_a_scoped_persons_web_overview_counts_only_its_tenants(
    world: World, carol_web: str
) -> None:
    shown = page(world.files, carol_web, "/overview")
    assert "tenant=acme" in shown
    assert "tenant=default" not in shown
    admin = page(
        world.files, session_cookie(world.files, "admin", world.files.ui_password), "/overview"
    )
    assert "tenant=default" in admin


@pytest.mark.parametrize("path", ["/tokens", "/jobs", "/audit", "/tenants"])
def test_a_scoped_persons_web_pages_show_nothing_of_another_tenant(
    world: World, carol_web: str, path: str
) -> None:
    shown = page(world.files, carol_web, path)
    for of_default in (world.tokens["default"], world.jobs["default"], *world.nodes["default"]):
        assert of_default not in shown
    # The tenant's name as a cell, an option, a link or a row's data.
    for named in (">default<", "tenant=default", 'data-tenant="default"'):
        assert named not in shown, (path, named)
    assert ">acme<" in shown or "tenant=acme" in shown or path == "/audit"


def test_a_scoped_persons_live_updates_send_another_tenants_node_as_gone(
    world: World, carol_web: str
) -> None:
    mine, theirs = world.nodes["acme"][0], world.nodes["default"][0]
    https = _https(world.files)
    try:
        https.request("GET", f"/ui/events?nodes={mine},{theirs}", headers={"Cookie": carol_web})
        answer = https.getresponse()
        assert answer.status == 200
        sent: dict[str, Any] = {}
        while len(sent) < 2:
            line = answer.fp.readline().decode()
            assert line, "the stream ended"
            if line.startswith("data: "):
                node = json.loads(line[len("data: ") :])
                sent[node["id"]] = node
    finally:
        https.close()
    assert sent[theirs] == {"id": theirs, "gone": True}
    assert sent[mine]["state"] == "accepted"


def test_a_scope_of_one_tenant_is_compared_as_equal_and_of_several_as_any() -> None:
    # `=` keeps a listing index led by the tenant in its order; no scope adds nothing.
    assert listing.Where().within("tenant", None).sql == ""
    one = listing.Where().within("tenant", ("acme",))
    assert (one.sql, dict(one.params)) == (" WHERE tenant = %(scope)s", {"scope": "acme"})
    several = listing.Where().within("tenant", ("acme", "beta"))
    assert several.sql == " WHERE tenant = ANY(%(scope)s)"
    assert dict(several.params) == {"scope": ["acme", "beta"]}
    assert listing.reaches(None, "x") and listing.reaches(("a", "b"), "b")
    assert not listing.reaches(("a",), "b")


# --- retention and the queued-jobs cap (issue 30); last, as they add a tenant and rows ------

KEPT = "kept"  # a tenant of these tests' own


def namespace_retention(files: ClusterFiles, name: str) -> str:
    """Namespace NAME's retention as the real `temporal` CLI shows it (`43200s`), asked with
    the admin's operator certificate (an operator may read on Temporal)."""
    ctx = files.context_dir
    temporal = shutil.which("temporal") or str(Path(sys.executable).parent / "temporal")
    done = subprocess.run(
        [
            temporal, "operator", "namespace", "describe", "--namespace", name, "-o", "json",
            "--address", f"{ADDRESS}:7233", "--tls-ca-path", str(ctx / "ca.crt"),
            "--tls-cert-path", str(ctx / "operator.crt"),
            "--tls-key-path", str(ctx / "operator.key"), "--command-timeout", "10s",
        ],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return str(json.loads(done.stdout)["config"]["workflowExecutionRetentionTtl"])


def test_a_tenants_retention_and_queued_cap_are_set_shown_and_its_namespace_keeps_as_long(
    cli: CliRunner, world: World
) -> None:
    made = listed(cli, world.admin, "tenant", "create", KEPT, "--job-retention", "12h",
                  "--max-queued-jobs", "2")  # fmt: skip
    assert (made["job_retention"], made["max_queued_jobs"]) == ("12h", 2)
    assert namespace_retention(world.files, KEPT) == "43200s"
    for bad, why in [
        (["--job-retention", "10m"], "job retention must be from 1h to 3650d, not 10m"),
        (["--job-retention", "soon"], "invalid duration 'soon'"),
        (["--max-queued-jobs", "0"], "max queued jobs must be from 1 to 1000000, not 0"),
    ]:
        done = cli("tenant", "set", KEPT, *bad, env=world.admin)
        assert done.code == 2 and len(done.err.strip().splitlines()) == 1, done.err
        assert why in done.err
    # The API checks what it is sent the same way, and a misspelt field is not lost quietly.
    for path, body, why in [
        (f"/api/v1/tenants/{KEPT}", {"job_retentoin": "1d"}, "unknown field 'job_retentoin'"),
        (f"/api/v1/tenants/{KEPT}", {"job_retention": 60}, "job retention must be from 1h"),
        ("/api/v1/cluster", {"audit_retention": "1h"}, "audit retention must be from 1d"),
    ]:
        status, answer = api(world.admin, "PATCH", path, body)
        assert status == 400 and answer["error"].startswith(why), (status, answer)
    changed = listed(cli, world.admin, "tenant", "set", KEPT, "--job-retention", "2d")
    assert changed["job_retention"] == "2d" and changed["max_queued_jobs"] == 2
    assert namespace_retention(world.files, KEPT) == "172800s"
    shown = listed(cli, world.admin, "tenant", "show", KEPT)
    assert (shown["job_retention_seconds"], shown["max_queued_jobs"]) == (172800, 2)
    assert refused(cli, world.bob, "tenant", "set", "acme", "--job-retention", "1d") == (
        "error: operator bob (operator of acme) may not change tenants"
    )


def test_a_job_past_its_tenants_queued_cap_is_refused_by_the_cli_the_api_and_the_web_form(
    cli: CliRunner, world: World
) -> None:
    def run() -> tuple[str, ...]:
        return ("job", "run", "--tenant", KEPT, "--detach", "--json", "--queue-timeout", "1h",
                "--", "true")  # fmt: skip

    for _ in range(2):  # no node of its own: they stay queued
        done = cli(*run(), env=world.admin)
        assert done.code == 0, done.err
    message = (
        f"tenant {KEPT} has 2 jobs queued, its limit (tenant set --max-queued-jobs);"
        " wait or cancel some"
    )
    assert refused(cli, world.admin, *run()) == f"error: {message}"
    status, answer = api(world.admin, "POST", "/api/v1/jobs", {"tenant": KEPT, "command": ["x"]})
    assert (status, answer) == (429, {"error": message})
    assert len(ok(world.admin, "GET", f"/api/v1/jobs?tenant={KEPT}")["jobs"]) == 2
    # The web run form says so too (bob, an operator of acme, with acme at its cap).
    queued = ok(world.admin, "GET", "/api/v1/jobs?tenant=acme&state=queued")["jobs"]
    ok(world.admin, "PATCH", "/api/v1/tenants/acme", {"max_queued_jobs": len(queued)})
    try:
        bob = session_cookie(world.files, "bob", WEB_PASSWORD)
        found = re.search(r'name="csrf" value="([^"]+)"', page(world.files, bob, "/jobs/new"))
        assert found is not None
        form = {"csrf": found.group(1), "tenant": "acme", "command": "true"}
        status, text = web_post_page(world.files, bob, "/jobs", form)
        assert status == 429 and f"tenant acme has {len(queued)} jobs queued" in text
    finally:
        ok(world.admin, "PATCH", "/api/v1/tenants/acme", {"max_queued_jobs": 10000})


def web_post_page(
    files: ClusterFiles, cookie: str, path: str, form: dict[str, str]
) -> tuple[int, str]:
    """FORM posted to PATH as the UI's own page posts it: the status and the page."""
    https = _https(files)
    try:
        https.request(
            "POST", path, urllib.parse.urlencode(form),
            {"Cookie": cookie, "Content-Type": "application/x-www-form-urlencoded",
             "Sec-Fetch-Site": "same-origin", "Accept": "text/html"},
        )  # fmt: skip
        answer = https.getresponse()
        return answer.status, answer.read().decode()
    finally:
        https.close()


def test_the_servers_delete_a_finished_job_past_its_retention_and_keep_a_younger_one(
    cli: CliRunner, world: World
) -> None:
    jobs = [j["id"] for j in ok(world.admin, "GET", f"/api/v1/jobs?tenant={KEPT}")["jobs"]]
    assert len(jobs) == 2, "the queued jobs of the test before"
    for job_id in jobs:  # ended for real: cancelled
        assert cli("job", "cancel", job_id, env=world.admin).code == 0
    wait_until(
        lambda: all(listed(cli, world.admin, "job", "show", j)["ended_at"] for j in jobs),
        20, "both jobs ended",
    )  # fmt: skip
    old, young = jobs
    with psycopg.connect(world.files.url.conninfo, autocommit=True) as conn:
        # Made old honestly: only its end is moved back, three days.
        conn.execute(
            "UPDATE jobs SET ended_at = ended_at - interval '3 days' WHERE id = %s", (old,)
        )
        # An audit row of the same age: the audit log is kept for ever unless told.
        conn.execute(
            "UPDATE audit_log SET at = at - interval '400 days' WHERE target = %s",
            (f"job:{old}",),
        )
    # A retention shorter than the old one's age, longer than the young one's: a pass is
    # due at once, and one of the servers makes it.
    listed(cli, world.admin, "tenant", "set", KEPT, "--job-retention", "1d")
    wait_until(
        lambda: api(world.admin, "GET", f"/api/v1/jobs/{old}")[0] == 404, 20, "the old job gone"
    )
    assert listed(cli, world.admin, "job", "show", young)["state"] == "cancelled"
    rows = ok(world.admin, "GET", "/api/v1/audit?limit=1000")["entries"]
    assert any(e["target"] == f"job:{old}" for e in rows), "audit rows kept: no retention"
    # Counted by the pruner's task once the deletion committed: the API may answer 404
    # (another task) a moment before.
    wait_until(lambda: pruned_jobs(world) >= 1, 5, "the pruned job counted")

    # The audit log's retention: a cluster setting, its change an audit row of its own.
    assert listed(cli, world.admin, "cluster", "info")["audit_retention"] == "keep"
    assert listed(cli, world.admin, "cluster", "set", "--audit-retention", "30d") == {
        "audit_retention": "30d", "audit_retention_seconds": 30 * 86400,
        "lock_node_labels": False, "session_record_input": False,
        "session_idle_timeout_seconds": 15 * 60, "session_max_seconds": 8 * 3600,
    }  # fmt: skip

    def old_rows() -> list[dict[str, Any]]:
        entries = ok(world.admin, "GET", "/api/v1/audit?limit=1000")["entries"]
        return [e for e in entries if e["target"] == f"job:{old}"]

    wait_until(lambda: not old_rows(), 20, "the 400-day-old audit rows gone")
    entries = ok(world.admin, "GET", "/api/v1/audit?limit=1000")["entries"]
    [change] = [e for e in entries if e["action"] == "cluster.set"]
    assert change["details"] == {"audit_retention": {"from": "keep", "to": "30d"}}
    assert any(e["target"] == f"job:{young}" for e in entries)
    listed(cli, world.admin, "cluster", "set", "--audit-retention", "keep")
