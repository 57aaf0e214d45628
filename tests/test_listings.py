"""Keyset paging of GET /api/v1/nodes and /api/v1/audit through one real server on
127.0.0.219, and the CLI's `node list` / `audit list` following the pages."""

from __future__ import annotations

import datetime as dt
import json
import ssl
import urllib.parse
from typing import Any, TypedDict

import psycopg
import pytest
from psycopg.types.json import Jsonb

from cli import client
from cli.client import ApiClient
from fixtures.cluster import ClusterFiles, Served
from fixtures.job_rows import add_node
from oz0 import audit, listing, nodes, tenants
from oz0.context import Context
from tests.conftest import CliRunner

ADDRESS = "127.0.0.219"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
Conn = psycopg.Connection[Any]


class NodeKind(TypedDict, total=False):
    """What `add_node` may be told of a node besides when it joined."""

    state: str
    tenant: str
    labels: dict[str, str]


@pytest.fixture(scope="module")
def cluster(served: Served) -> ClusterFiles:
    return served.files


CONN_CLUSTER = "served"
CLEAN = ("DELETE FROM nodes",)


@pytest.fixture
def api(cluster: ClusterFiles) -> ApiClient:
    return ApiClient(Context.load(cluster.context_path))


def api_get(files: ClusterFiles, path: str, query: dict[str, str]) -> tuple[int, Any]:
    """One GET with the operator's certificate: the status and the decoded answer."""
    ctx = Context.load(files.context_path)
    tls = ssl.create_default_context(cafile=str(ctx.ca_path))
    tls.check_hostname = False
    tls.load_cert_chain(str(ctx.cert_path), str(ctx.key_path))
    https = client.connection(ADDRESS, 8443, tls, timeout=10)
    try:
        https.request("GET", f"{path}?{urllib.parse.urlencode(query)}")
        answer = https.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        https.close()


FILTERS: list[dict[str, str]] = [
    {},
    {"state": "pending"},
    {"tenant": "acme"},
    {"label": "role=web"},
    {"label": "zone"},
    {"search": "WEB-"},
    {"state": "accepted", "tenant": "default", "label": "role=db", "search": "WEB-0"},
]


def matches(row: dict[str, Any], wanted: dict[str, str]) -> bool:
    key, _, value = wanted.get("label", "").partition("=")
    return (
        ("state" not in wanted or row["state"] == wanted["state"])
        and ("tenant" not in wanted or row["tenant"] == wanted["tenant"])
        and (not key or (key in row["labels"] and (not value or row["labels"][key] == value)))
        and (
            "search" not in wanted
            or wanted["search"].lower() in row["id"]
            or wanted["search"].lower() in row["hostname"].lower()
        )
    )


@pytest.mark.parametrize(
    "wanted", FILTERS, ids=lambda f: ",".join(f"{k}={v}" for k, v in f.items())
)
def test_pages_list_every_node_once_with_nodes_joining_between_pages(
    cluster: ClusterFiles, conn: Conn, api: ApiClient, wanted: dict[str, str]
) -> None:
    if not tenants.exists(conn, "acme"):
        api.post("/api/v1/tenants", {"name": "acme"})
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    kinds: list[NodeKind] = [
        {"state": "accepted", "labels": {"role": "web", "zone": "a"}},
        {"state": "pending", "labels": {"role": "db"}},
        {"state": "accepted", "tenant": "acme", "labels": {"zone": "b"}},
        {"state": "blocked", "labels": {"role": "web"}},
        {"state": "accepted", "labels": {"role": "db", "zone": "c"}},
    ]
    # Three nodes a second, so that pages end between nodes of one joined_at: the ID
    # breaks the tie, and a cursor without it would skip or repeat them.
    for i in range(90):
        add_node(
            conn,
            joined_at=base + dt.timedelta(seconds=i // 3),
            connected=False,
            hostname=f"{'Web' if i % 2 else 'db'}-{i:03d}",
            **kinds[i % 5],
        )
    listed: list[dict[str, Any]] = []
    late: list[str] = []
    cursor: str | None = None
    for page_number in range(100):
        answer = api.get("/api/v1/nodes", {**wanted, "limit": 4, "cursor": cursor})
        assert len(answer["nodes"]) <= 4
        listed += answer["nodes"]
        cursor = answer["next_cursor"]
        if cursor is None:
            break
        # Between pages: a node joins before the last one listed (it is not listed, and
        # no node moves across the cursor as it would with an OFFSET), one in its very
        # second, and one after all the rest (both listed, once).
        at = dt.datetime.fromisoformat(listed[-1]["joined_at"])
        kind = kinds[page_number % 5]
        add_node(
            conn,
            joined_at=at - dt.timedelta(seconds=1),
            connected=False,
            hostname=f"web-early-{page_number}",
            **kind,
        )
        later = base + dt.timedelta(hours=1, seconds=page_number)
        late.append(
            add_node(
                conn, joined_at=later, connected=False, hostname=f"web-late-{page_number}", **kind
            )
        )
    else:
        pytest.fail("the pages never ended")
    ids = [n["id"] for n in listed]
    assert len(ids) == len(set(ids)), "a node listed twice"
    keys = [(n["joined_at"], n["id"]) for n in listed]
    assert keys == sorted(keys)
    assert all(matches(n, wanted) for n in listed)
    everything = api.get("/api/v1/nodes", {**wanted, "limit": 1000})
    assert everything["next_cursor"] is None
    every = {n["id"]: n for n in everything["nodes"]}
    early = {i for i, n in every.items() if n["hostname"].startswith("web-early-")}
    assert set(ids) == set(every) - early, "a node missing from the pages"
    assert early.isdisjoint(ids)
    assert {i for i in late if i in every} <= set(ids)


def test_a_malformed_cursor_and_a_limit_out_of_bounds_are_refused(
    cluster: ClusterFiles, conn: Conn
) -> None:
    add_node(conn, joined_at=dt.datetime.now(dt.UTC), connected=False)
    good = listing.encode({"joined_at": "2026-01-01T00:00:00+00:00", "id": "node-000000000000"})
    assert api_get(cluster, "/api/v1/nodes", {"cursor": good})[0] == 200
    malformed = "error: malformed cursor: pass the next_cursor of the previous page unchanged"
    for bad in (
        "junk!", "", good[:-3], listing.encode({"id": "node-000000000000"}),
        listing.encode({"joined_at": "yesterday", "id": "node-000000000000"}),
        listing.encode({"joined_at": "2026-01-01T00:00:00", "id": "node-000000000000"}),
        listing.encode({"joined_at": 5, "id": "node-000000000000"}), "A" * 600,
    ):  # fmt: skip
        status, answer = api_get(cluster, "/api/v1/nodes", {"cursor": bad})
        assert (status, f"error: {answer['error']}") == (400, malformed), bad
    for limit in ("0", "1001", "-1", "ten", "1.5"):
        status, answer = api_get(cluster, "/api/v1/nodes", {"limit": limit})
        assert (status, answer) == (400, {"error": "limit must be a whole number from 1 to 1000"})
    assert len(api_get(cluster, "/api/v1/nodes", {"limit": "1000"})[1]["nodes"]) == 1
    # Audit: the same cursor rules, its own limits.
    status, answer = api_get(cluster, "/api/v1/audit", {"cursor": good})
    assert (status, answer["error"]) == (400, malformed.removeprefix("error: "))
    status, answer = api_get(cluster, "/api/v1/audit", {"limit": "10001"})
    assert (status, answer) == (400, {"error": "limit must be a whole number from 1 to 10000"})
    status, answer = api_get(
        cluster, "/api/v1/audit", {"cursor": audit.cursor_after(_entry(1)), "before": "5"}
    )
    assert (status, answer) == (400, {"error": "give cursor or before, not both"})


def _entry(entry_id: int) -> audit.Entry:
    return audit.Entry(entry_id, dt.datetime.now(dt.UTC), "operator", "admin", "x", "y", {})


def test_audit_pages_list_every_entry_once_newest_first(
    cluster: ClusterFiles, conn: Conn, api: ApiClient
) -> None:
    with conn.transaction():
        for i in range(30):
            audit.record(conn, audit.Actor("operator", f"pager{i % 2}"), "test.page", f"t:{i}")
    wanted = {"action": "test.page", "actor": "operator:pager1"}
    expected = [
        e.id
        for e in audit.entries(conn, action=wanted["action"], actor=wanted["actor"], limit=1000)
    ]
    assert len(expected) == 15
    listed: list[int] = []
    cursor: str | None = None
    while True:
        answer = api.get("/api/v1/audit", {**wanted, "limit": 4, "cursor": cursor})
        listed += [e["id"] for e in answer["entries"]]
        cursor = answer["next_cursor"]
        if cursor is None:
            break
        audit.record(conn, audit.Actor("operator", "pager1"), "test.page", "t:newer")
    assert listed == expected


def test_the_cli_follows_pages_and_limit_counts_every_row(
    cluster: ClusterFiles, conn: Conn, cli: CliRunner
) -> None:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    ids = [
        add_node(conn, joined_at=base + dt.timedelta(seconds=i), connected=False, hostname=f"h{i}")
        for i in range(11)
    ]
    env = cluster.cli_env

    def json_of(*args: str) -> Any:
        result = cli(*args, env=env)
        assert result.code == 0, result.err
        return json.loads(result.out)

    assert [n["id"] for n in json_of("node", "list", "--page-size", "3", "--json")] == ids
    assert [
        n["id"] for n in json_of("node", "list", "--page-size", "3", "--limit", "7", "--json")
    ] == ids[:7]
    assert [
        n["id"] for n in json_of("node", "list", "--page-size", "4", "--search", "H1", "--json")
    ] == [ids[1], ids[10]]
    # The JSON is print_json's, written a page at a time.
    one = cli("node", "list", "--json", env=env).out
    assert one == json.dumps(json.loads(one), indent=2) + "\n"
    assert cli("node", "list", "--page-size", "2", "--json", env=env).out == one
    assert json_of("node", "list", "--label", "none", "--json") == []
    assert cli("node", "list", "--label", "none", "--json", env=env).out == "[]\n"
    table = cli("node", "list", "--page-size", "3", env=env).out.splitlines()
    assert table[0].split()[:2] == ["ID", "STATE"] and len(table) == 12
    assert [line.split()[0] for line in table[1:]] == ids
    assert (
        len(cli("node", "list", "--page-size", "3", "--limit", "5", env=env).out.splitlines()) == 6
    )

    with conn.transaction():
        for i in range(9):
            audit.record(conn, audit.Actor("operator", "cli-pager"), "test.cli", f"t:{i}")
    newest = [e.id for e in audit.entries(conn, actor="cli-pager", limit=100)]
    paged = json_of("audit", "list", "--actor", "cli-pager", "--page-size", "2", "--json")
    assert [e["id"] for e in paged] == newest
    limited = json_of(
        "audit", "list", "--actor", "cli-pager", "--page-size", "2", "--limit", "5", "--json"
    )
    assert [e["id"] for e in limited] == newest[:5]
    older = json_of(
        "audit",
        "list",
        "--actor",
        "cli-pager",
        "--page-size",
        "2",
        "--before",
        str(newest[2]),
        "--json",
    )
    assert [e["id"] for e in older] == newest[3:]

    for args, message in [
        (("node", "list", "--limit", "0"), "--limit must be a whole number of 1 or more"),
        (
            ("audit", "list", "--page-size", "1001"),
            "--page-size must be a whole number from 1 to 1000",
        ),
        (
            ("node", "list", "--label", "=x"),
            "invalid label filter '=x': use KEY=VALUE or KEY, e.g. role=web",
        ),
    ]:
        bad = cli(*args, env=env)
        assert (bad.code, bad.out, bad.err) == (1, "", f"error: {message}\n")


def test_the_web_ui_count_stops_where_it_is_told(conn: Conn) -> None:
    base = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for i in range(12):
        add_node(
            conn,
            joined_at=base + dt.timedelta(seconds=i),
            connected=False,
            state="pending" if i % 2 else "accepted",
        )
    assert nodes.count_nodes(conn) == 12
    assert nodes.count_nodes(conn, most=5) == 5
    assert nodes.count_nodes(conn, nodes.NodeFilter(state="pending"), most=100) == 6


def test_the_api_page_written_by_postgresql_is_what_to_json_gives(conn: Conn) -> None:
    server = conn.execute("SELECT id FROM servers").fetchone()
    assert server is not None
    whole = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
    made = [
        add_node(
            conn,
            joined_at=whole,
            connected=False,
            labels={"zone": "b", "os": "linux", "arch": "x86_64"},
        ),
        add_node(
            conn,
            joined_at=whole + dt.timedelta(microseconds=1),
            connected=False,
            state="blocked",
            hostname="h-1",
        ),
        add_node(
            conn,
            joined_at=whole + dt.timedelta(seconds=1, microseconds=470_000),
            connected=False,
            state="pending",
        ),
    ]
    conn.execute(
        "UPDATE nodes SET server = %s, last_seen = now(), reason = %s WHERE id = %s",
        (server[0], 'said "no"\\\n\t\x1b ü', made[0]),
    )
    conn.execute(
        "UPDATE nodes SET server = %s, last_seen = now() - interval '1 hour', token_id = NULL"
        " WHERE id = %s",
        (server[0], made[1]),
    )
    texts, cursor = nodes.list_page_json(conn, limit=2)
    objects, expected_cursor = nodes.list_page(conn, limit=2)
    assert cursor == expected_cursor
    texts += nodes.list_page_json(conn, limit=2, after=cursor)[0]
    every = nodes.list_nodes(conn)
    assert [n.id for n in every] == made and [o.id for o in objects] == made[:2]
    for text, node in zip(texts, every, strict=True):
        decoded = json.loads(text)
        assert decoded == node.to_json()
        assert list(decoded) == sorted(decoded) and list(decoded["labels"]) == sorted(node.labels)
    assert json.loads(texts[0])["connected"] is True and json.loads(texts[1])["server"] is None


def test_the_api_audit_page_written_by_postgresql_is_what_to_json_gives(conn: Conn) -> None:
    details: list[dict[str, Any]] = [
        {},
        {"summary": True, "count": 3, "reasons": {"unknown": 2, "zz": 1, "expired": 0}},
        # jsonb keeps the keys of an object shortest first: these sort otherwise.
        {"zz": [{"yy": 1, "b": None}, "x", 1.5], "a": 'said "no"\n\x1b ü', "bbb": {}, "c": 1},
    ]
    with conn.transaction():
        for d in details:
            audit.record(conn, audit.Actor("ui", "json-check"), "test.json", "t:json", d)
        conn.execute(
            "UPDATE audit_log SET at = date_trunc('second', at) WHERE details = %s", (Jsonb({}),)
        )
    filters = audit.Filters(actor="ui:json-check")
    texts, cursor = audit.entries_page_json(conn, filters, before=None, limit=2)
    entries, expected_cursor = audit.entries_page(conn, filters, before=None, limit=2)
    assert cursor == expected_cursor
    assert cursor is not None
    texts += audit.entries_page_json(conn, filters, before=audit.before_of(cursor), limit=2)[0]
    every = audit.entries(conn, actor="ui:json-check")
    assert len(every) == 3 and [e.id for e in entries] == [e.id for e in every[:2]]

    def sorted_keys(value: Any) -> bool:
        if isinstance(value, dict):
            return list(value) == sorted(value) and all(sorted_keys(v) for v in value.values())
        if isinstance(value, list):
            return all(sorted_keys(v) for v in value)
        return True

    for text, entry in zip(texts, every, strict=True):
        decoded = json.loads(text)
        assert decoded == entry.to_json()
        assert sorted_keys(decoded)
