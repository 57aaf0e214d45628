"""A person of two tenants (issue 46): Duo, an operator of amber and basil, sees the things
of both and nothing of cedar's, through the CLI (`--json`), and the web UI's pages in
Debian's chromium, of one real server on 127.0.0.97 with a real agent in each tenant.

Every other end-to-end scope test has people of one tenant, whose scope is compared as
`tenant = x`; a person of several is `tenant = ANY(...)` (oz0/listing.py), and the audit
log's `tenants <@ ...` (oz0/audit.py): a listing that kept only the first of them, or
dropped the condition for several, would pass those. Here it would not: nodes, jobs (and
where a job may run), join tokens, the audit log and schedules are each listed, and each
kind's thing of cedar asked for by its ID answers as one that does not exist.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from fixtures import scoped_people
from fixtures.agent import AgentProcess, ready, stop_all
from fixtures.cluster import ClusterFiles, Served
from fixtures.polling import wait_until
from fixtures.scoped_people import Person
from fixtures.ui_agent import RUNNING_BOUND
from oz0.context import CONTEXT_FILE
from tests.conftest import CliRunner
from tests.web_support import browser

__all__ = ["browser"]  # the fixture, used by name

ADDRESS = "127.0.0.97"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{ADDRESS}:7443"
BASE = f"https://{ADDRESS}:8443"
PAIR = ("amber", "basil")  # Duo's tenants
THIRD = "cedar"  # not Duo's
TENANTS = (*PAIR, THIRD)
# Never due while the tests run.
NEVER = "0 0 1 1 *"
# What no tenant has, by kind: asked for, it answers as a thing of cedar's must.
ABSENT = {
    "node": "node-000000000000", "job": "job-000000000000",
    "schedule": "sched-000000000000", "token": "tok-000000000000", "tenant": "nosuch",
}  # fmt: skip
# A job's run on a real agent (its first start of a new tenant's namespace among it).
JOB_BOUND = 60.0


@dataclass(frozen=True)
class World:
    files: ClusterFiles
    root: Person  # a cluster-wide admin
    duo: Person  # an operator of amber and basil
    # Each tenant's one of each kind, by tenant.
    nodes: dict[str, str]
    jobs: dict[str, str]
    tokens: dict[str, str]
    schedules: dict[str, str]

    @property
    def env(self) -> dict[str, str]:
        """Duo's CLI environment."""
        return {"OZ0_CONTEXT": str(self.duo.certs.directory / CONTEXT_FILE)}

    def of(self, kind: str, tenants: tuple[str, ...]) -> set[str]:
        """The IDs of KIND (nodes, jobs, tokens, schedules) of TENANTS."""
        by_tenant: dict[str, str] = getattr(self, kind)
        return {by_tenant[t] for t in tenants}

    def targets(self, tenants: tuple[str, ...]) -> set[str]:
        """The audit targets of everything made in TENANTS."""
        return {
            *(f"tenant:{t}" for t in tenants),
            *(f"node:{n}" for n in self.of("nodes", tenants)),
            *(f"job:{j}" for j in self.of("jobs", tenants)),
            *(f"token:{t}" for t in self.of("tokens", tenants)),
            *(f"schedule:{s}" for s in self.of("schedules", tenants)),
        }


def schedule_of(root: Person, tenant: str) -> str:
    """A schedule of TENANT's that never runs while the tests do: its ID."""
    body = {"job": {"tenant": tenant, "command": ["true"]}, "cron": NEVER}

    def made() -> str | None:
        status, answer = root.api("POST", "/api/v1/schedules", body)
        return str(answer["id"]) if status == 201 else None

    # A new tenant's namespace is usable within seconds.
    return wait_until(made, 30, f"a schedule made in tenant {tenant}")


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    files = served.files
    here = tmp_path_factory.mktemp("pair")
    root = scoped_people.make(files, here, ADDRESS, "root", "admin", [])
    tokens: dict[str, str] = {}
    agents: dict[str, AgentProcess] = {}
    try:
        for tenant in TENANTS:
            root.ok("POST", "/api/v1/tenants", {"name": tenant})
            token = root.ok("POST", "/api/v1/tokens", {"tenant": tenant, "max_uses": 1})
            tokens[tenant] = token["id"]
            agents[tenant] = AgentProcess.joining(
                here / f"node-{tenant}", [EDGE], files.ca_hash, token=token["token"]
            ).start()
        # While the agents start.
        duo = scoped_people.make(files, here, ADDRESS, "duo", "operator", PAIR)
        nodes = {
            tenant: str(agent.wait_reported(ready, RUNNING_BOUND)["node_id"])
            for tenant, agent in agents.items()
        }
        jobs = {
            tenant: root.ok(
                "POST", "/api/v1/jobs", {"tenant": tenant, "command": ["true"], "node": node}
            )["id"]
            for tenant, node in nodes.items()
        }
        schedules = {tenant: schedule_of(root, tenant) for tenant in TENANTS}

        def ended() -> list[dict[str, Any]] | None:
            shown = [root.ok("GET", f"/api/v1/jobs/{j}") for j in jobs.values()]
            return shown if all(s["ended_at"] for s in shown) else None

        done = wait_until(ended, JOB_BOUND, "each tenant's job ended on its agent")
        assert [(j["state"], j["attempts"][0]["node"]) for j in done] == [
            ("succeeded", nodes[t]) for t in TENANTS
        ]
        one = World(files, root, duo, nodes, jobs, tokens, schedules)
        # The cluster-wide admin lists all three tenants' things: cedar's are there to hide.
        for kind in ("nodes", "jobs", "tokens", "schedules"):
            listed = {x["id"] for x in root.ok("GET", f"/api/v1/{kind}")[kind]}
            assert listed >= one.of(kind, TENANTS), kind
        yield one
    finally:
        stop_all(list(agents.values()))


def as_json(cli: CliRunner, world: World, *args: str) -> Any:
    """Duo's `orchestrator-zero ARGS --json`, decoded."""
    done = cli(*args, "--json", env=world.env)
    assert done.code == 0, done.err
    return done.json()


def refusal(cli: CliRunner, world: World, *args: str) -> str:
    """The one line Duo's refused command prints (it exits non-zero)."""
    done = cli(*args, env=world.env)
    assert done.code != 0, done.out
    lines = done.err.strip().splitlines()
    assert len(lines) == 1, done.err
    return lines[0]


def as_if_absent(cli: CliRunner, world: World, kind: str, *args: str) -> str:
    """Duo's command ARGS about cedar's thing of KIND (`{}` in ARGS) refused in the words
    of one that does not exist: the line, with the ID written `{}`."""
    theirs = getattr(world, f"{kind}s")[THIRD] if kind != "tenant" else THIRD
    lines = []
    for value in (theirs, ABSENT[kind]):
        filled = [a.replace("{}", value) for a in args]
        lines.append(refusal(cli, world, *filled).replace(value, "{}"))
    assert lines[0] == lines[1], lines
    return lines[0]


# --- the CLI ----------------------------------------------------------------------------


def test_node_list_and_show_give_both_tenants_nodes_and_none_of_the_third(
    cli: CliRunner, world: World
) -> None:
    listed = as_json(cli, world, "node", "list")
    assert {n["id"] for n in listed} == world.of("nodes", PAIR)
    for tenant in PAIR:
        shown = as_json(cli, world, "node", "show", world.nodes[tenant])
        assert (shown["tenant"], shown["state"]) == (tenant, "accepted")
        by_tenant = as_json(cli, world, "node", "list", "--tenant", tenant)
        assert [n["id"] for n in by_tenant] == [world.nodes[tenant]]
    assert as_json(cli, world, "node", "list", "--tenant", THIRD) == []
    assert as_if_absent(cli, world, "node", "node", "show", "{}") == "error: node {} not found"


def test_job_list_and_show_give_both_tenants_jobs_and_none_of_the_third(
    cli: CliRunner, world: World
) -> None:
    listed = as_json(cli, world, "job", "list")
    # Other tests of the file run jobs of Duo's tenants: theirs are Duo's to see too.
    assert {j["id"] for j in listed} >= world.of("jobs", PAIR)
    assert {j["tenant"] for j in listed} == set(PAIR)
    assert world.jobs[THIRD] not in {j["id"] for j in listed}
    for tenant in PAIR:
        shown = as_json(cli, world, "job", "show", world.jobs[tenant])
        assert (shown["tenant"], shown["attempts"][0]["node"]) == (tenant, world.nodes[tenant])
        assert {j["tenant"] for j in as_json(cli, world, "job", "list", "--tenant", tenant)} == {
            tenant
        }
    assert as_json(cli, world, "job", "list", "--tenant", THIRD) == []
    assert as_if_absent(cli, world, "job", "job", "show", "{}") == "error: job {} not found"
    assert as_if_absent(cli, world, "job", "job", "logs", "{}") == "error: job {} not found"


def test_jobs_run_in_either_tenant_on_its_nodes_and_not_in_the_third(
    cli: CliRunner, world: World
) -> None:
    # Followed to their end: Duo reads each tenant's job and its output as it runs.
    for tenant, where in [("amber", ("--node", world.nodes["amber"])), ("basil", ("--all",))]:
        done = cli("job", "run", "--tenant", tenant, *where, "--", "sh", "-c",
                   "echo $OZ0_NODE_ID", env=world.env)  # fmt: skip
        assert (done.code, done.out) == (0, f"{world.nodes[tenant]}\n"), done.err
    # Cedar's node, from a tenant of Duo's: as a node that does not exist.
    line = as_if_absent(
        cli, world, "node", "job", "run", "--tenant", "amber", "--node", "{}", "--detach",
        "--", "true",
    )  # fmt: skip
    assert line == "error: node {} is not a node of tenant amber"
    line = as_if_absent(
        cli, world, "tenant", "job", "run", "--tenant", "{}", "--detach", "--", "true"
    )
    assert line == "error: operator duo (operator of amber, basil) may not run jobs in tenant {}"
    jobs = world.root.ok("GET", f"/api/v1/jobs?tenant={THIRD}")["jobs"]
    assert [j["id"] for j in jobs] == [world.jobs[THIRD]]


def test_token_list_gives_both_tenants_tokens_and_none_of_the_third(
    cli: CliRunner, world: World
) -> None:
    listed = as_json(cli, world, "token", "list")
    assert {t["id"] for t in listed} == world.of("tokens", PAIR)
    assert {t["tenant"] for t in listed} == set(PAIR)
    line = as_if_absent(cli, world, "token", "token", "revoke", "{}")
    assert line == "error: token {} not found"
    tokens = world.root.ok("GET", "/api/v1/tokens")["tokens"]
    assert [t["revoked"] for t in tokens if t["id"] == world.tokens[THIRD]] == [False]


def test_audit_list_gives_the_rows_about_both_tenants_and_none_about_the_third(
    cli: CliRunner, world: World
) -> None:
    # Each row's tenants as written; rows written after this read are left out below.
    with psycopg.connect(world.files.main_db) as conn:
        written = conn.execute("SELECT id, tenants FROM audit_log ORDER BY id DESC").fetchall()
    newest = written[0][0]
    # Rows about amber, basil or both: Duo's; about cedar, or the cluster as a whole: not.
    wanted = [i for i, tenants in written if tenants and set(tenants) <= set(PAIR)]
    entries = [e for e in as_json(cli, world, "audit", "list") if e["id"] <= newest]
    assert [e["id"] for e in entries] == wanted
    targets = {e["target"] for e in entries}
    assert targets >= world.targets(PAIR)
    assert not targets & world.targets((THIRD,))
    for target in (f"node:{world.nodes[THIRD]}", f"tenant:{THIRD}", f"job:{world.jobs[THIRD]}"):
        assert as_json(cli, world, "audit", "list", "--target", target) == []


def test_schedule_list_gives_both_tenants_schedules_and_none_of_the_third(
    cli: CliRunner, world: World
) -> None:
    listed = as_json(cli, world, "schedule", "list")
    assert {s["id"] for s in listed} == world.of("schedules", PAIR)
    assert {s["tenant"] for s in listed} == set(PAIR)
    for tenant in PAIR:
        shown = as_json(cli, world, "schedule", "show", world.schedules[tenant])
        assert shown["tenant"] == tenant
    assert as_json(cli, world, "schedule", "list", "--tenant", THIRD) == []
    line = as_if_absent(cli, world, "schedule", "schedule", "show", "{}")
    assert line == "error: schedule {} not found"


def test_tenant_list_gives_both_tenants_and_not_the_third(cli: CliRunner, world: World) -> None:
    assert [t["name"] for t in as_json(cli, world, "tenant", "list")] == list(PAIR)
    line = as_if_absent(cli, world, "tenant", "tenant", "show", "{}")
    assert line == "error: tenant {} not found"


# --- the web UI -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duo_page(browser: Any, world: World) -> Iterator[Any]:
    """Duo signed in on the web UI, in the file's one browser."""
    context = browser.new_context(ignore_https_errors=True)
    context.set_default_timeout(15_000)
    one = context.new_page()
    one.goto(f"{BASE}/")
    one.get_by_label("Username").fill(world.duo.name)
    one.get_by_label("Password").fill(scoped_people.WEB_PASSWORD)
    one.get_by_role("button", name="Sign in").click()
    one.wait_for_url(f"{BASE}/overview")
    yield one
    context.close()


# Each page, and what of a tenant's it shows: the IDs of its own kind, the audit rows'
# targets; the overview and the tenants page, a row of each tenant (its name alone may
# be in an audit row's target, `tenant:basil`, among the overview's recent ones).
PAGES = ["nodes", "jobs", "tokens", "audit", "schedules", "overview", "tenants"]


def things_on(world: World, kind: str, tenants: tuple[str, ...]) -> set[str]:
    if kind == "audit":
        return world.targets(tenants)
    if kind == "overview":
        return {f'<a href="/nodes?tenant={t}">{t}</a>' for t in tenants}
    if kind == "tenants":
        return {f'data-tenant="{t}"' for t in tenants}
    return world.of(kind, tenants)


@pytest.mark.parametrize("kind", PAGES)
def test_a_web_page_shows_both_tenants_things_and_nothing_of_the_third(
    world: World, duo_page: Any, kind: str
) -> None:
    duo_page.goto(f"{BASE}/{kind}")
    html = duo_page.content()
    # What a person sees, where it is text; a row's mark, where it is not.
    shown = html if kind in ("overview", "tenants") else duo_page.locator("main").inner_text()
    assert {m for m in things_on(world, kind, PAIR) if m not in shown} == set(), kind
    assert {t for t in things_on(world, kind, (THIRD,)) if t in html} == set(), kind
    # Nor cedar's name anywhere: a cell, a filter's choice, a link or a row's data.
    assert not re.search(rf"\b{THIRD}\b", html), kind


def test_web_pages_of_one_thing_open_for_both_tenants_and_not_for_the_third(
    world: World, duo_page: Any
) -> None:
    for kind in ("nodes", "jobs"):
        for tenant in PAIR:
            opened = duo_page.goto(f"{BASE}/{kind}/{getattr(world, kind)[tenant]}")
            assert opened.status == 200, (kind, tenant)
        theirs, absent = getattr(world, kind)[THIRD], ABSENT[kind[:-1]]
        answers = []
        for value in (theirs, absent):
            opened = duo_page.goto(f"{BASE}/{kind}/{value}")
            text = duo_page.locator("main").inner_text()
            answers.append((opened.status, text.replace(value, "{}")))
        assert answers[0] == answers[1] and answers[0][0] == 404, answers
