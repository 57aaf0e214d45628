"""One answer for "absent" and "not in your tenants" (issue 42): a person of tenant acme
asks every API route and web page that looks a thing up by its ID or name about one that
does not exist and about one of another tenant, and gets the same status and the same
text (the ID it asked about aside), with one real server on 127.0.0.94.

Each kind is walked: nodes (one by one and many at once), jobs, schedules, files, join tokens,
tenants, people (enrolled and pending), audit rows, and what names a tenant or a node to
make something there. Ada, an admin of acme, asks: her role reaches every route but the
cluster-wide admin's, so each handler runs its own lookup.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import trio
import trio_websocket

from fixtures import edge_client, scoped_people
from fixtures.app_routes import registered_endpoints
from fixtures.cluster import Served
from fixtures.polling import wait_until
from fixtures.scoped_people import Person
from oz0 import node_sessions
from oz0.context import Context
from oz0_common import certs

ADDRESS = "127.0.0.94"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{ADDRESS}:7443"
# Never due while the tests run.
NEVER = "0 0 1 1 *"


@dataclass(frozen=True)
class World:
    root: Person  # a cluster-wide admin
    ada: Person  # admin of acme, signed in on the web UI too
    # What does not exist, and what exists in another tenant than acme, by kind.
    absent: dict[str, str]
    theirs: dict[str, str]
    # A schedule of acme's: what a probe's path names as MINE.
    mine: str


async def _join(edge: str, ca_pem: bytes, token: str | None) -> str:
    keys = edge_client.NodeKeys.new()
    keys.ca_pem = ca_pem
    answer = await edge_client.join(edge, keys, token=token, labels={"role": "web"})
    assert answer.get("type") == "joined", answer
    return keys.node_id


def _session_of(served: Served, tenant: str, node: str) -> str:
    """A session of TENANT on NODE, ended, as its server writes one (no agent here runs
    one: what is asked is the lookup, not the session)."""
    session_id = "session-0000000000bb"
    url = served.files.main_db
    with psycopg.connect(url) as conn:
        node_sessions.create(
            conn, session_id, tenant=tenant, node_id=node, person="root", command=["true"],
            header={"version": 2, "width": 80, "height": 24}, server="s", records_input=False,
        )  # fmt: skip
        node_sessions.finish(conn, session_id, 0, None)
    return session_id


async def _open_session(person: Person, node: str) -> dict[str, Any]:
    """The first answer of the session websocket to PERSON asking for a session on NODE."""
    tcp = await trio.open_tcp_stream(person.address, 8443)
    tls = trio.SSLStream(tcp, person.certs.ssl_context(), server_hostname=certs.API_SERVER_NAME)
    try:
        async with trio.open_nursery() as nursery:
            ws = await trio_websocket.wrap_client_stream(
                nursery, tls, person.address, f"/api/v1/nodes/{node}/session"
            )
            opening = {"type": "open", "command": ["true"], "rows": 24, "cols": 80}
            await ws.send_message(json.dumps(opening))
            with trio.fail_after(10):
                answer: dict[str, Any] = json.loads(await ws.get_message())
            await ws.aclose()
            nursery.cancel_scope.cancel()
    finally:
        # The server closes first (it answers with an error); trio-websocket's client then
        # waits for the TCP close, and the cancel above ends that wait with the socket open
        # (ci33: garbage-collected in the next test, an unraisable ResourceWarning).
        await trio.aclose_forcefully(tls)
    return answer


def _schedule(admin: Person, tenant: str) -> dict[str, Any]:
    body = {"job": {"tenant": tenant, "command": ["true"]}, "cron": NEVER}
    # The new tenant's namespace is usable within seconds.
    made: dict[str, Any] = wait_until(
        lambda: (a := admin.api("POST", "/api/v1/schedules", body))[0] == 201 and a[1],
        30, f"a schedule made in tenant {tenant}",
    )  # fmt: skip
    return made


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> World:
    files = served.files
    root = tmp_path_factory.mktemp("people")
    admin = scoped_people.make(files, root, ADDRESS, "root", "admin", [])
    for tenant in ("acme", "beta"):
        admin.ok("POST", "/api/v1/tenants", {"name": tenant})
    ca_pem = Context.load(files.context_path).ca_path.read_bytes()
    token = admin.ok("POST", "/api/v1/tokens", {"tenant": "beta", "max_uses": 0})
    node = trio.run(_join, EDGE, ca_pem, token["token"])
    pending = trio.run(_join, EDGE, ca_pem, None)  # tenant default, waiting for an operator
    job = admin.ok(
        "POST", "/api/v1/jobs", {"tenant": "beta", "command": ["true"], "queue_timeout": 3600}
    )
    schedule, mine = (_schedule(admin, tenant) for tenant in ("beta", "acme"))
    theirs_file = "b" * 64
    admin.ok("POST", "/api/v1/files", {"tenant": "beta", "sha256": theirs_file, "size": 1,
                                       "name": "x"})  # fmt: skip
    scoped_people.make(files, root, ADDRESS, "bea", "operator", ["beta"])
    admin.ok("POST", "/api/v1/operators", {"name": "ben", "role": "viewer", "tenants": ["beta"]})
    scoped_people.make(files, root, ADDRESS, "abel", "viewer", ["acme"])
    ada = scoped_people.make(files, root, ADDRESS, "ada", "admin", ["acme"]).signed_in()
    session = _session_of(served, "beta", node)
    return World(
        admin,
        ada,
        absent={
            "session": "session-000000000000",
            "node": "node-000000000000", "pending": "node-00000000000f",
            "job": "job-000000000000", "schedule": "sched-000000000000",
            "token": "tok-000000000000", "tenant": "nosuch", "person": "nobody",
            "enrolling": "nobody-yet", "file": "f" * 64,
        },
        theirs={
            "session": session,
            "node": node, "pending": pending, "job": job["id"], "schedule": schedule["id"],
            "token": token["id"], "tenant": "beta", "person": "bea", "enrolling": "ben",
            "file": theirs_file,
        },
        mine=mine["id"],
    )  # fmt: skip


@dataclass(frozen=True)
class Probe:
    """One request naming a thing of KIND (`{}` in the path, and in the body's strings)."""

    kind: str
    method: str
    path: str
    body: Any = None
    web: bool = False

    def filled(self, value: str, mine: str) -> tuple[str, Any]:
        def fill(item: Any) -> Any:
            if isinstance(item, str):
                return item.replace("{}", value)
            if isinstance(item, list):
                return [fill(i) for i in item]
            if isinstance(item, dict):
                return {k: fill(v) for k, v in item.items()}
            return item

        return self.path.replace("{}", value).replace("MINE", mine), fill(self.body)

    def __str__(self) -> str:
        return f"{'web' if self.web else 'api'} {self.method} {self.path} ({self.kind})"


def api(kind: str, method: str, path: str, body: Any = None) -> Probe:
    return Probe(kind, method, path, body)


def web(kind: str, method: str, path: str, form: dict[str, str] | None = None) -> Probe:
    return Probe(kind, method, path, form, web=True)


JOB = {"command": ["true"], "queue_timeout": 3600}
PROBES = [
    # Nodes, one at a time.
    api("node", "GET", "/api/v1/nodes/{}"),
    api("pending", "POST", "/api/v1/nodes/{}/accept", {}),
    api("pending", "POST", "/api/v1/nodes/{}/reject", {"reason": "no"}),
    api("node", "POST", "/api/v1/nodes/{}/block", {"reason": "probe"}),
    api("node", "POST", "/api/v1/nodes/{}/unblock", {}),
    api("node", "POST", "/api/v1/nodes/{}/purge", {}),
    api("node", "DELETE", "/api/v1/nodes/{}"),
    # Nodes, many at once: by ID, and by label in a tenant.
    api("node", "POST", "/api/v1/nodes/block", {"ids": ["{}"], "reason": "probe"}),
    api("node", "POST", "/api/v1/nodes/unblock", {"ids": ["{}"]}),
    api("tenant", "POST", "/api/v1/nodes/block",
        {"selector": {"role": "web"}, "tenant": "{}", "reason": "probe"}),
    api("tenant", "GET", "/api/v1/nodes?tenant={}"),
    # Jobs.
    api("job", "GET", "/api/v1/jobs/{}"),
    api("job", "GET", "/api/v1/jobs/{}/output"),
    api("job", "POST", "/api/v1/jobs/{}/cancel", {}),
    api("tenant", "GET", "/api/v1/jobs?tenant={}"),
    api("tenant", "POST", "/api/v1/jobs", {**JOB, "tenant": "{}"}),
    api("node", "POST", "/api/v1/jobs", {**JOB, "tenant": "acme", "node": "{}"}),
    # Schedules.
    api("schedule", "GET", "/api/v1/schedules/{}"),
    api("schedule", "POST", "/api/v1/schedules/{}/pause", {}),
    api("schedule", "POST", "/api/v1/schedules/{}/unpause", {}),
    api("schedule", "POST", "/api/v1/schedules/{}/trigger", {}),
    api("schedule", "DELETE", "/api/v1/schedules/{}"),
    api("schedule", "PATCH", "/api/v1/schedules/{}", {"owner": "ada"}),
    # A schedule's new owner: a person of another tenant reads as one who does not exist.
    api("person", "PATCH", "/api/v1/schedules/MINE", {"owner": "{}"}),
    api("tenant", "GET", "/api/v1/schedules?tenant={}"),
    api("tenant", "POST", "/api/v1/schedules",
        {"job": {"tenant": "{}", "command": ["true"]}, "cron": NEVER}),
    api("schedule", "GET", "/api/v1/jobs?schedule={}"),
    # Files (docs/files.md): a tenant's stored files, named by SHA-256.
    api("file", "GET", "/api/v1/files/{}?tenant=acme"),
    api("file", "DELETE", "/api/v1/files/{}?tenant=acme"),
    api("file", "POST", "/api/v1/files/{}/chunks", {"tenant": "acme", "seq": 0, "data": "eA=="}),
    api("tenant", "GET", "/api/v1/files?tenant={}"),
    api("tenant", "POST", "/api/v1/files",
        {"tenant": "{}", "sha256": "a" * 64, "size": 1, "name": "x"}),
    api("tenant", "GET", "/api/v1/files/{}?tenant={}".replace("{}", "b" * 64, 1)),
    api("tenant", "DELETE", "/api/v1/files/{}?tenant={}".replace("{}", "b" * 64, 1)),
    # Join tokens.
    api("token", "POST", "/api/v1/tokens/{}/revoke", {}),
    api("tenant", "POST", "/api/v1/tokens", {"tenant": "{}"}),
    # Tenants.
    api("tenant", "GET", "/api/v1/tenants/{}"),
    api("tenant", "PATCH", "/api/v1/tenants/{}", {"max_queued_jobs": 5}),
    # People: enrolled and pending, and what names a tenant to give.
    api("person", "GET", "/api/v1/operators/{}"),
    api("person", "PATCH", "/api/v1/operators/{}", {"role": "viewer"}),
    api("person", "DELETE", "/api/v1/operators/{}"),
    api("enrolling", "GET", "/api/v1/operators/{}"),
    api("enrolling", "PATCH", "/api/v1/operators/{}", {"role": "operator"}),
    api("enrolling", "DELETE", "/api/v1/operators/{}"),
    api("tenant", "POST", "/api/v1/operators",
        {"name": "newcomer", "role": "viewer", "tenants": ["acme", "{}"]}),
    api("tenant", "PATCH", "/api/v1/operators/abel", {"tenants": ["acme", "{}"]}),
    # Sessions (docs/sessions.md): one's record and recording, and its web page.
    api("session", "GET", "/api/v1/sessions/{}"),
    api("session", "GET", "/api/v1/sessions/{}/recording"),
    # The audit log, by target and by actor.
    api("node", "GET", "/api/v1/audit?target=node:{}"),
    api("tenant", "GET", "/api/v1/audit?target=tenant:{}"),
    api("person", "GET", "/api/v1/audit?actor={}"),
    # The web UI: nodes.
    web("node", "GET", "/nodes/{}"),
    web("node", "GET", "/nodes/{}/delete"),
    web("node", "GET", "/nodes/{}/purge"),
    web("pending", "POST", "/nodes/{}/accept"),
    web("pending", "POST", "/nodes/{}/reject", {"reason": "no"}),
    web("node", "POST", "/nodes/{}/block", {"reason": "probe"}),
    web("node", "POST", "/nodes/{}/unblock"),
    web("node", "POST", "/nodes/{}/delete"),
    web("node", "POST", "/nodes/{}/purge", {"confirm": "{}"}),
    web("tenant", "GET", "/nodes?tenant={}"),
    # Jobs.
    web("job", "GET", "/jobs/{}"),
    web("job", "GET", "/jobs/{}/live.json"),
    web("job", "POST", "/jobs/{}/cancel"),
    web("tenant", "GET", "/jobs?tenant={}"),
    web("tenant", "POST", "/jobs", {"tenant": "{}", "command": "true"}),
    # Schedules.
    web("schedule", "GET", "/schedules/{}/delete"),
    web("schedule", "POST", "/schedules/{}/pause"),
    web("schedule", "POST", "/schedules/{}/unpause"),
    web("schedule", "POST", "/schedules/{}/trigger"),
    web("schedule", "POST", "/schedules/{}/delete"),
    web("tenant", "POST", "/schedules", {"tenant": "{}", "command": "true", "cron": NEVER}),
    # Tokens.
    web("token", "GET", "/tokens/{}/revoke"),
    web("token", "POST", "/tokens/{}/revoke"),
    web("tenant", "POST", "/tokens", {"tenant": "{}", "ttl": "1h", "max_uses": "1"}),
    # Sessions.
    web("session", "GET", "/sessions/{}"),
    web("session", "GET", "/sessions/{}/frames.json"),
    # The audit log.
    web("node", "GET", "/audit?target=node:{}"),
    web("person", "GET", "/audit?actor={}"),
]  # fmt: skip


def answer(person: Person, probe: Probe, value: str, mine: str) -> tuple[int, str]:
    """PROBE's answer about VALUE, its text with VALUE written `{}` (and a page's CSRF
    token left out: a form on it carries the session's)."""
    path, body = probe.filled(value, mine)
    if probe.web:
        status, text = person.web(probe.method, path, body)
    else:
        status, decoded = person.api(probe.method, path, body)
        text = repr(decoded)
    text = re.sub(r'name="csrf" value="[^"]+"', 'name="csrf"', text)
    return status, text.replace(value, "{}")


@pytest.mark.parametrize("probe", PROBES, ids=str)
def test_a_thing_of_another_tenant_is_answered_as_one_that_does_not_exist(
    world: World, probe: Probe
) -> None:
    absent = answer(world.ada, probe, world.absent[probe.kind], world.mine)
    theirs = answer(world.ada, probe, world.theirs[probe.kind], world.mine)
    assert theirs == absent
    # Refused or empty, never a thing of the other tenant.
    assert absent[0] >= 400 or probe.method == "GET", absent


def test_a_taken_name_reads_the_same_whoever_holds_it_and_whatever_its_state(
    world: World,
) -> None:
    # Names are the cluster's own, so a taken one is refused; that it is taken is all a
    # tenant's admin learns: not whether its holder has enrolled, nor where.
    def add(name: str) -> tuple[int, str]:
        status, answer = world.ada.api(
            "POST", "/api/v1/operators", {"name": name, "role": "viewer", "tenants": ["acme"]}
        )
        return status, str(answer).replace(name, "{}")

    enrolled, pending, mine = add("bea"), add("ben"), add("abel")
    assert enrolled == pending == mine
    assert enrolled[0] == 409 and "exists already" in enrolled[1], enrolled


def test_nothing_of_the_other_tenant_was_changed_by_the_walk(world: World) -> None:
    # After the walk (tests run in file order): every refusal changed nothing.
    root, theirs = world.root, world.theirs
    assert root.ok("GET", f"/api/v1/nodes/{theirs['node']}")["state"] == "accepted"
    assert root.ok("GET", f"/api/v1/nodes/{theirs['pending']}")["state"] == "pending"
    assert root.ok("GET", f"/api/v1/jobs/{theirs['job']}")["state"] == "queued"
    assert root.ok("GET", f"/api/v1/schedules/{theirs['schedule']}")["paused"] is False
    tokens = root.ok("GET", "/api/v1/tokens")["tokens"]
    assert [t["revoked"] for t in tokens if t["id"] == theirs["token"]] == [False]
    people = {p["name"]: p for p in root.ok("GET", "/api/v1/operators")["operators"]}
    assert people["bea"]["role"] == "operator" and people["ben"]["state"] == "pending"
    assert people["abel"]["tenants"] == ["acme"] and "newcomer" not in people
    assert root.ok("GET", f"/api/v1/files/{theirs['file']}?tenant=beta")["name"] == "x"


# Routes with a parameter in their path that names no thing of a tenant.
NOT_A_THING = {"static", "web.static", "operator_renew"}


# The session websocket, asked in a test of its own (a websocket, not a request).
SESSION_OPEN = ("GET", "/api/v1/nodes/{}/session")


def test_a_session_on_a_node_of_another_tenant_is_answered_as_on_none(world: World) -> None:
    absent, theirs = (
        trio.run(_open_session, world.ada, node)
        for node in (world.absent["node"], world.theirs["node"])
    )
    assert theirs["type"] == "error", theirs
    assert str(theirs).replace(world.theirs["node"], "{}") == str(absent).replace(
        world.absent["node"], "{}"
    )


def test_every_route_that_names_a_thing_in_its_path_is_walked() -> None:
    walked = {(p.method, ("web." if p.web else "") + p.path.split("?")[0]) for p in PROBES}
    walked.add(SESSION_OPEN)
    missing = []
    for endpoint, (path, methods) in registered_endpoints().items():
        if "<" not in path or endpoint in NOT_A_THING:
            continue
        pattern = re.sub(r"<[^>]+>", "{}", path)
        for method in methods:
            if (method, ("web." if endpoint.startswith("web.") else "") + pattern) not in walked:
                missing.append(f"{method} {path} ({endpoint})")
    assert not missing, f"routes naming a thing that the walk does not ask: {missing}"
