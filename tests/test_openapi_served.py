"""The API described, held to what a real server answers (issue 45), on 127.0.0.55: the
document is served to signed-in people only, and every operation of it is called on a real
server with real data, each answer checked against the shape the document gives for its
status (an answer of a shape it does not describe fails, and so does an operation no call
here reaches)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema
import psycopg
import pytest
import trio
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fixtures import edge_client, scoped_people
from fixtures.cluster import Served
from fixtures.polling import wait_until
from fixtures.scoped_people import Person
from oz0 import node_sessions
from oz0.context import Context
from oz0_common import certs

ADDRESS = "127.0.0.55"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{ADDRESS}:7443"
DOCUMENT = "/api/v1/openapi.json"
NEVER = "0 0 1 1 *"
SESSION = "session-0000000000cc"


@dataclass(frozen=True)
class Answer:
    status: int
    media_type: str
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


def call(person: Person, method: str, path: str, body: Any = None) -> Answer:
    https = person.connection()
    try:
        data = None if body is None else json.dumps(body)
        headers = {} if body is None else {"Content-Type": "application/json"}
        https.request(method, path, body=data, headers=headers)
        answer = https.getresponse()
        media = (answer.getheader("Content-Type") or "").split(";", 1)[0].strip()
        return Answer(answer.status, media, answer.read())
    finally:
        https.close()


@dataclass
class World:
    root: Person  # a cluster-wide admin
    viewer: Person
    renewing: Person  # renews its certificate (its old one is refused after)
    ids: dict[str, str] = field(default_factory=dict)


async def _join(ca_pem: bytes, token: str | None) -> str:
    keys = edge_client.NodeKeys.new()
    keys.ca_pem = ca_pem
    answer = await edge_client.join(EDGE, keys, token=token, labels={"role": "web"})
    assert answer.get("type") == "joined", answer
    return keys.node_id


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> World:
    files = served.files
    root_dir = tmp_path_factory.mktemp("people")
    root = scoped_people.make(files, root_dir, ADDRESS, "root", "admin", [])
    viewer = scoped_people.make(files, root_dir, ADDRESS, "vic", "viewer", [])
    renewing = scoped_people.make(files, root_dir, ADDRESS, "rena", "viewer", [])
    scoped_people.make(files, root_dir, ADDRESS, "opal", "operator", ["acme"])
    root.ok("POST", "/api/v1/tenants", {"name": "acme"})
    ca_pem = Context.load(files.context_path).ca_path.read_bytes()
    token = root.ok("POST", "/api/v1/tokens", {"tenant": "acme", "max_uses": 0})
    joined = [trio.run(_join, ca_pem, token["token"]) for _ in range(3)]
    pending = [trio.run(_join, ca_pem, None) for _ in range(2)]
    job = root.ok(
        "POST", "/api/v1/jobs", {"tenant": "acme", "command": ["true"], "queue_timeout": 3600}
    )
    schedule: dict[str, Any] = wait_until(
        lambda: (
            (a := root.api("POST", "/api/v1/schedules",
                           {"job": {"tenant": "acme", "command": ["true"]}, "cron": NEVER}))[0]
            == 201 and a[1]
        ),
        30, "a schedule made in tenant acme",
    )  # fmt: skip
    code = root.ok("POST", "/api/v1/operators", {"name": "enid", "role": "viewer"})["code"]
    url = files.main_db
    with psycopg.connect(url) as conn:
        node_sessions.create(
            conn, SESSION, tenant="acme", node_id=joined[0], person="root", command=["true"],
            header={"version": 2, "width": 80, "height": 24}, server="s", records_input=False,
        )  # fmt: skip
        node_sessions.finish(conn, SESSION, 0, None)
    ids = {
        "node": joined[0], "node_purged": joined[1], "node_deleted": joined[2],
        "pending_accepted": pending[0], "pending_rejected": pending[1],
        "job": job["id"], "schedule": schedule["id"], "token": token["id"], "code": code,
    }  # fmt: skip
    return World(root, viewer, renewing, ids)


@pytest.fixture(scope="module")
def document(world: World) -> dict[str, Any]:
    answer = call(world.viewer, "GET", DOCUMENT)
    assert answer.status == 200, answer
    found: dict[str, Any] = answer.json()
    return found


def test_the_document_is_served_to_signed_in_people_only(served: Served, world: World) -> None:
    https = world.root.connection(certificate=False)
    try:
        https.request("GET", DOCUMENT)
        answer = https.getresponse()
        status, body = answer.status, json.loads(answer.read())
    finally:
        https.close()
    assert status == 401, (status, body)
    assert body == {"error": "an operator client certificate is required"}
    assert call(world.viewer, "GET", DOCUMENT).json()["openapi"] == "3.1.0"


DATA = b"x"
SHA = hashlib.sha256(DATA).hexdigest()


def _csr(name: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    return certs.make_csr(key, name).public_bytes(serialization.Encoding.PEM).decode()


def _calls(ids: dict[str, str]) -> Iterator[tuple[str, str, str, Any]]:
    """(who, method, path, body): every operation at least once, in an order that leaves
    each call something to act on."""
    node, job, sched = ids["node"], ids["job"], ids["schedule"]
    yield "root", "GET", "/healthz", None
    yield "root", "GET", "/readyz", None
    yield "root", "GET", "/metrics", None
    yield "root", "GET", "/agent/oz0-node", None
    yield "root", "GET", "/agent/oz0-node.sha256", None
    yield "viewer", "GET", DOCUMENT, None
    yield "root", "GET", "/api/v1/cluster", None
    yield "root", "PATCH", "/api/v1/cluster", {"lock_node_labels": False}
    yield "viewer", "PATCH", "/api/v1/cluster", {"lock_node_labels": False}
    yield "root", "GET", "/api/v1/operator/enroll", None
    yield "root", "POST", "/api/v1/operator/enroll", {"code": "nope", "csr": "nope"}
    yield "root", "POST", "/api/v1/operator/enroll", {"code": ids["code"], "csr": _csr("enid")}
    yield "renewing", "POST", "/api/v1/operator/renew", {"csr": _csr("rena")}
    yield "root", "GET", "/api/v1/operators", None
    yield "root", "POST", "/api/v1/operators", {"name": "newbie", "role": "viewer"}
    yield "root", "GET", "/api/v1/operators/vic", None
    yield "root", "PATCH", "/api/v1/operators/vic", {"role": "viewer"}
    yield "root", "DELETE", "/api/v1/operators/newbie", None
    yield "root", "GET", "/api/v1/tenants", None
    yield "root", "POST", "/api/v1/tenants", {"name": "beta"}
    yield "root", "GET", "/api/v1/tenants/acme", None
    yield "root", "PATCH", "/api/v1/tenants/acme", {"max_queued_jobs": 1000}
    yield "root", "GET", "/api/v1/tokens", None
    yield "root", "POST", "/api/v1/tokens", {"tenant": "acme"}
    yield "root", "POST", f"/api/v1/tokens/{ids['token']}/revoke", {}
    yield "root", "GET", "/api/v1/nodes", None
    yield "root", "GET", f"/api/v1/nodes/{node}", None
    yield "root", "POST", f"/api/v1/nodes/{ids['pending_accepted']}/accept", {}
    yield "root", "POST", f"/api/v1/nodes/{ids['pending_rejected']}/reject", {"reason": "no"}
    yield "root", "POST", "/api/v1/nodes/block", {"ids": [node], "reason": "probe"}
    yield "root", "POST", "/api/v1/nodes/unblock", {"ids": [node]}
    yield "root", "POST", f"/api/v1/nodes/{node}/block", {"reason": "probe"}
    yield "root", "POST", f"/api/v1/nodes/{node}/unblock", {}
    yield "root", "POST", f"/api/v1/nodes/{ids['node_purged']}/purge", {}
    yield "root", "DELETE", f"/api/v1/nodes/{ids['node_deleted']}", None
    yield "root", "GET", f"/api/v1/nodes/{node}/session", None
    yield "root", "GET", "/api/v1/sessions", None
    yield "root", "GET", f"/api/v1/sessions/{SESSION}", None
    yield "root", "GET", f"/api/v1/sessions/{SESSION}/recording", None
    yield "root", "GET", "/api/v1/audit?limit=5", None
    yield "viewer", "GET", "/api/v1/events?after=start&follow=false", None
    yield "root", "POST", "/api/v1/jobs", {"tenant": "acme", "command": ["true"]}
    yield "root", "GET", "/api/v1/jobs", None
    yield "root", "GET", f"/api/v1/jobs/{job}", None
    yield "root", "GET", f"/api/v1/jobs/{job}/output", None
    yield "root", "POST", f"/api/v1/jobs/{job}/cancel", {}
    yield "root", "POST", "/api/v1/files", {"tenant": "acme", "sha256": SHA, "size": 1,
                                            "name": "x"}  # fmt: skip
    yield "root", "POST", f"/api/v1/files/{SHA}/chunks", {"tenant": "acme", "seq": 0,
                                                          "data": "eA=="}  # fmt: skip
    yield "root", "GET", "/api/v1/files", None
    yield "root", "GET", f"/api/v1/files/{SHA}?tenant=acme", None
    yield "root", "DELETE", f"/api/v1/files/{SHA}?tenant=acme", None
    yield "root", "GET", "/api/v1/schedules", None
    yield "root", "GET", f"/api/v1/schedules/{sched}", None
    yield "root", "POST", f"/api/v1/schedules/{sched}/pause", {}
    yield "root", "POST", f"/api/v1/schedules/{sched}/unpause", {}
    yield "root", "POST", f"/api/v1/schedules/{sched}/trigger", {}
    yield "root", "PATCH", f"/api/v1/schedules/{sched}", {"owner": "opal"}
    yield "root", "DELETE", f"/api/v1/schedules/{sched}", None
    yield "root", "POST", "/api/v1/schedules", {"job": {"tenant": "acme", "command": ["true"]},
                                                "every": 3600}  # fmt: skip


def _operation_of(document: dict[str, Any], method: str, path: str) -> tuple[str, dict[str, Any]]:
    """The document's path template and operation that PATH (a real one) is an instance of."""
    bare = path.split("?", 1)[0].split("/")
    for template, item in document["paths"].items():
        parts = template.split("/")
        if len(parts) != len(bare) or method.lower() not in item:
            continue
        if all(t == b or t.startswith("{") for t, b in zip(parts, bare, strict=True)):
            return template, item[method.lower()]
    raise AssertionError(f"{method} {path}: no operation of the document is this")


def _shape_errors(document: dict[str, Any], operation: dict[str, Any], answer: Answer) -> str:
    """Why ANSWER is not what OPERATION describes for its status (empty: it is)."""
    responses = operation["responses"]
    described = responses.get(str(answer.status)) or responses.get(f"{str(answer.status)[0]}XX")
    if described is None:
        return f"status {answer.status} is not described"
    content = described.get("content")
    if content is None:
        return "" if not answer.body else "a body where none is described"
    if answer.media_type not in content:
        return f"media type {answer.media_type} is not one of {sorted(content)}"
    if answer.media_type != "application/json":
        return ""
    schema = {**content[answer.media_type]["schema"], "components": document["components"]}
    validator = jsonschema.Draft202012Validator(schema)
    found = sorted(validator.iter_errors(answer.json()), key=lambda e: list(e.path))
    return "; ".join(f"{list(e.path)}: {e.message}" for e in found[:3])


def test_every_operation_answers_as_the_document_says(
    world: World, document: dict[str, Any]
) -> None:
    people = {"root": world.root, "viewer": world.viewer, "renewing": world.renewing}
    called: set[tuple[str, str]] = set()
    wrong = []
    for who, method, path, body in _calls(world.ids):
        template, operation = _operation_of(document, method, path)
        called.add((template, method.lower()))
        answer = call(people[who], method, path, body)
        assert answer.status < 500 or answer.status == 503, (method, path, answer)
        why = _shape_errors(document, operation, answer)
        if why:
            wrong.append(f"{method} {path} → {answer.status}: {why} ({answer.body[:200]!r})")
    assert not wrong, "answers the document does not describe:\n" + "\n".join(wrong)
    every = {(t, m) for t, item in document["paths"].items() for m in item}
    assert not every - called, f"operations no call reached: {sorted(every - called)}"


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/nodes/not-a-node", None),
        ("POST", "/api/v1/nodes/not-a-node/accept", {}),
        ("POST", "/api/v1/nodes/not-a-node/block", {"reason": "probe"}),
        ("DELETE", "/api/v1/nodes/node-XYZ", None),
        ("POST", "/api/v1/nodes/block", {"ids": ["not-a-node"], "reason": "probe"}),
    ],
)
def test_a_malformed_node_id_is_bad_input_not_a_conflict(
    world: World, method: str, path: str, body: Any
) -> None:
    """Found by the fuzz: a node ID that is not one was answered 409 (a conflict, as if a
    node's state forbade the change); it is bad input."""
    answer = call(world.root, method, path, body)
    assert answer.status == 400, answer
    assert answer.json()["error"].startswith("invalid node ID "), answer


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("GET", "/api/v1/sessions?node=a%00b", None),
        ("GET", "/api/v1/jobs?tenant=%00", None),
        ("GET", "/api/v1/tenants/a%00b", None),
        ("POST", "/api/v1/jobs", {"tenant": "acme", "command": ["echo", "a\u0000b"]}),
        ("POST", "/api/v1/tenants", {"name": "\u0000"}),
    ],
)
def test_a_nul_character_is_bad_input(world: World, method: str, path: str, body: Any) -> None:
    """Found by the fuzz: a NUL in a query reached PostgreSQL, which holds none in text,
    and was answered 500."""
    answer = call(world.root, method, path, body)
    assert answer.status == 400, answer
    assert "NUL character" in answer.json()["error"], answer


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/tenants/a%0Ab",
        "/api/v1/operators/a%0Ab%1B%5B2J",
        "/api/v1/nodes/a%0Ab",
        "/api/v1/sessions/a%0D%0Ab",
    ],
)
def test_an_error_naming_what_was_sent_stays_one_line(world: World, path: str) -> None:
    """Found by the fuzz: an error naming what the caller sent (a tenant's, a person's
    name) carried its newlines and terminal escapes into the answer; they are escaped."""
    answer = call(world.root, "GET", path)
    assert 400 <= answer.status < 500, answer
    message = answer.json()["error"]
    assert message.isprintable(), message
    assert "\\n" in message, message


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/v1/nodes/not-a-node/reject", {"reason": "two\nlines"}),
        ("/api/v1/nodes/{node}/reject", {"reason": "two\nlines"}),
        ("/api/v1/nodes/{node}/block", {"reason": "\u0013"}),
        ("/api/v1/nodes/{node}/block", {"reason": " "}),
    ],
)
def test_a_reason_that_is_not_one_line_is_bad_input(world: World, path: str, body: Any) -> None:
    """Found by the fuzz: a reason that is not one printable line (or none where one is
    required) was answered 409, as if the node's state forbade the change."""
    answer = call(world.root, "POST", path.replace("{node}", world.ids["node"]), body)
    assert answer.status == 400, answer
