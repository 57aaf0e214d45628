from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import re
import threading
import time
from typing import Any, cast

import psycopg
import pytest

from fixtures.cluster import ClusterFiles, StartServer
from fixtures.cluster_db import uses
from oz0 import audit, tokens
from oz0.context import Context
from oz0.errors import Oz0Error
from tests.conftest import CliRunner

ADMIN = audit.Actor("operator", "admin")
ADDRESS = "127.0.0.15"
TOKEN_STRING = re.compile(r"^(tok-[0-9a-f]{12})\.([A-Za-z0-9_-]{43})$")
UNKNOWN_ID = "tok-000000000000"


CONN_CLUSTER = "cluster_files"


def new_token(
    conn: psycopg.Connection[Any],
    *,
    tenant: str = "default",
    ttl: dt.timedelta | None = dt.timedelta(hours=24),
    max_uses: int = 1,
    labels: dict[str, str] | None = None,
    description: str = "",
) -> tuple[tokens.JoinToken, str]:
    with conn.transaction():
        return tokens.create(
            conn,
            tenant=tenant,
            ttl=ttl,
            max_uses=max_uses,
            labels=labels or {},
            description=description,
            actor=ADMIN,
        )


def consume(conn: psycopg.Connection[Any], token_string: str) -> tokens.JoinToken:
    with conn.transaction():
        return tokens.consume(conn, token_string)


def refusal(conn: psycopg.Connection[Any], token_string: str) -> tokens.TokenRefused:
    with pytest.raises(tokens.TokenRefused) as caught, conn.transaction():
        tokens.consume(conn, token_string)
    return caught.value


def audit_rows(conn: psycopg.Connection[Any], action: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT actor_kind, actor, target, details FROM audit_log WHERE action = %s ORDER BY id",
        (action,),
    ).fetchall()


# --- parse_ttl --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("24h", dt.timedelta(hours=24)),
        ("30m", dt.timedelta(minutes=30)),
        ("7d", dt.timedelta(days=7)),
        ("90s", dt.timedelta(seconds=90)),
        ("1h30m", dt.timedelta(hours=1, minutes=30)),
        ("1d2h3m4s", dt.timedelta(days=1, hours=2, minutes=3, seconds=4)),
        ("0", None),
    ],
)
def test_parse_ttl_accepts_durations_and_0_for_never(
    text: str, expected: dt.timedelta | None
) -> None:
    assert tokens.parse_ttl(text) == expected


@pytest.mark.parametrize(
    "text",
    ["", "24", "h", "1.5h", "-1h", "24H", "1m1h", "0h", "0s", "1 h", "abc", "24h ago", "36501d"],
)
def test_parse_ttl_refuses_anything_else_in_one_line(text: str) -> None:
    with pytest.raises(Oz0Error) as caught:
        tokens.parse_ttl(text)
    message = str(caught.value)
    assert message.startswith(f"invalid ttl {text!r}: ")
    assert "\n" not in message


# --- create, list, revoke ---------------------------------------------------------------


def test_create_returns_a_usable_string_and_stores_only_the_secrets_hash(
    conn: psycopg.Connection[Any],
) -> None:
    token, string = new_token(
        conn,
        max_uses=5,
        labels={"team": "data", "k8s.io/zone": "eu-1"},
        description="data team laptops",
    )
    match = TOKEN_STRING.match(string)
    assert match is not None, string
    token_id, secret = match.groups()
    assert token.id == token_id
    assert (token.tenant, token.uses, token.max_uses) == ("default", 0, 5)
    assert token.labels == {"team": "data", "k8s.io/zone": "eu-1"}
    assert token.description == "data team laptops"
    assert (token.revoked, token.revoked_at, token.created_by) == (False, None, "operator:admin")
    assert token.expires_at is not None
    assert token.expires_at - token.created_at == dt.timedelta(hours=24)

    stored = conn.execute(
        "SELECT secret_sha256, row_to_json(t)::text FROM join_tokens t WHERE id = %s", (token_id,)
    ).fetchone()
    assert stored is not None
    assert bytes(stored[0]) == hashlib.sha256(secret.encode()).digest()
    assert secret not in stored[1]
    everything = conn.execute("SELECT string_agg(details::text, ' ') FROM audit_log").fetchone()
    assert everything is not None and secret not in everything[0]

    assert audit_rows(conn, "token.create") == [
        (
            "operator",
            "admin",
            f"token:{token_id}",
            {
                "tenant": "default",
                "max_uses": 5,
                "expires_at": token.expires_at.isoformat(),
                "labels": {"team": "data", "k8s.io/zone": "eu-1"},
                "description": "data team laptops",
            },
        )
    ]
    assert consume(conn, string).uses == 1


def test_list_and_to_json_show_every_token_without_secrets(
    conn: psycopg.Connection[Any],
) -> None:
    first, first_string = new_token(conn, ttl=None, max_uses=0, labels={"a": "1"})
    second, _ = new_token(conn, description="second")
    listed = tokens.list_tokens(conn)
    assert [t.id for t in listed] == [first.id, second.id]
    data = listed[0].to_json()
    assert data == {
        "id": first.id,
        "tenant": "default",
        "uses": 0,
        "max_uses": 0,
        "expires_at": None,
        "labels": {"a": "1"},
        "description": "",
        "revoked": False,
        "revoked_at": None,
        "created_at": first.created_at.isoformat(),
        "created_by": "operator:admin",
        "lock_labels": False,
    }
    assert first_string.split(".")[1] not in json.dumps([t.to_json() for t in listed])
    assert second.expires_at is not None
    assert listed[1].to_json()["expires_at"] == second.expires_at.isoformat()


def test_create_refuses_bad_input_and_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"tenant": "nope"}, "tenant nope does not exist"),
        ({"max_uses": -1}, "invalid max uses -1: "),
        ({"max_uses": 2**31}, f"invalid max uses {2**31}: "),
        ({"labels": {"Team": "x"}}, "invalid label key 'Team': "),
        ({"labels": {"-a": "x"}}, "invalid label key '-a': "),
        ({"labels": {"a-": "x"}}, "invalid label key 'a-': "),
        ({"labels": {"": "x"}}, "invalid label key '': "),
        ({"labels": {"a" * 64: "x"}}, f"invalid label key '{'a' * 64}': "),
        ({"labels": {"team": "x" * 254}}, "invalid value for label team: "),
        ({"labels": {"team": "a\nb"}}, "invalid value for label team: "),
        ({"description": "two\nlines"}, "invalid description: "),
    ]
    for kwargs, message in cases:
        with pytest.raises(Oz0Error) as caught:
            new_token(conn, **kwargs)
        assert str(caught.value).startswith(message), (kwargs, str(caught.value))
        assert "\n" not in str(caught.value)
    assert tokens.list_tokens(conn) == []
    assert audit_rows(conn, "token.create") == []
    # The edges of what is allowed.
    token, _ = new_token(
        conn, labels={"a": "", "k8s.io/role-x_y": "x" * 253, "a" * 63: "v"}, max_uses=2**31 - 1
    )
    assert token.max_uses == 2**31 - 1 and len(token.labels) == 3


def test_revoke_marks_the_token_audits_and_refuses_twice_or_unknown(
    conn: psycopg.Connection[Any],
) -> None:
    token, string = new_token(conn, max_uses=3)
    consume(conn, string)
    with conn.transaction():
        revoked = tokens.revoke(conn, token.id, ADMIN)
    assert revoked.revoked and revoked.revoked_at is not None and revoked.uses == 1
    assert tokens.list_tokens(conn)[0].revoked
    assert audit_rows(conn, "token.revoke") == [
        ("operator", "admin", f"token:{token.id}", {"tenant": "default", "uses": 1})
    ]
    with pytest.raises(tokens.TokenAlreadyRevoked) as again, conn.transaction():
        tokens.revoke(conn, token.id, ADMIN)
    assert str(again.value) == f"token {token.id} is already revoked"
    with pytest.raises(tokens.TokenNotFound) as unknown, conn.transaction():
        tokens.revoke(conn, UNKNOWN_ID, ADMIN)
    assert str(unknown.value) == f"token {UNKNOWN_ID} not found"
    assert len(audit_rows(conn, "token.revoke")) == 1

    refused = refusal(conn, string)
    assert (refused.reason, refused.token_id, str(refused)) == (
        "revoked",
        token.id,
        "join token revoked",
    )
    assert uses(conn, token.id) == 1


# --- consume ----------------------------------------------------------------------------


def test_a_token_is_used_up_after_max_uses(conn: psycopg.Connection[Any]) -> None:
    token, string = new_token(conn, max_uses=2)
    assert consume(conn, string).uses == 1
    assert consume(conn, string).uses == 2
    refused = refusal(conn, string)
    assert (refused.reason, refused.token_id, str(refused)) == (
        "used_up",
        token.id,
        "join token used up",
    )
    assert uses(conn, token.id) == 2


def test_max_uses_0_is_unlimited(conn: psycopg.Connection[Any]) -> None:
    token, string = new_token(conn, max_uses=0)
    for n in range(1, 26):
        assert consume(conn, string).uses == n
    assert uses(conn, token.id) == 25


def test_a_token_without_ttl_never_expires(conn: psycopg.Connection[Any]) -> None:
    token, string = new_token(conn, ttl=None)
    assert token.expires_at is None and token.to_json()["expires_at"] is None
    row = conn.execute("SELECT expires_at FROM join_tokens WHERE id = %s", (token.id,)).fetchone()
    assert row == (None,)
    conn.execute("UPDATE join_tokens SET created_at = now() - interval '100 years'")
    assert consume(conn, string).uses == 1


def test_an_expired_token_is_refused_by_the_database_clock(
    conn: psycopg.Connection[Any],
) -> None:
    token, string = new_token(conn, ttl=dt.timedelta(hours=1), max_uses=0)
    assert consume(conn, string).uses == 1
    conn.execute(
        "UPDATE join_tokens SET expires_at = now() - interval '1 second' WHERE id = %s",
        (token.id,),
    )
    refused = refusal(conn, string)
    assert (refused.reason, refused.token_id, str(refused)) == (
        "expired",
        token.id,
        "join token expired",
    )
    assert uses(conn, token.id) == 1
    conn.execute(
        "UPDATE join_tokens SET expires_at = now() + interval '1 minute' WHERE id = %s",
        (token.id,),
    )
    assert consume(conn, string).uses == 2


def test_unknown_ids_wrong_secrets_and_malformed_strings_reveal_nothing(
    conn: psycopg.Connection[Any],
) -> None:
    token, string = new_token(conn, max_uses=0)
    secret = string.split(".", 1)[1]
    wrong_secret = f"{token.id}.{'A' * 43}"
    presented = [
        f"{UNKNOWN_ID}.{secret}",
        wrong_secret,
        f"{token.id}.{secret}x",
        "",
        "garbage",
        token.id,
        f"{token.id}.",
        f".{secret}",
        f"{token.id.upper()}.{secret}",
        f"tok-0123.{secret}",
    ]
    refusals = [refusal(conn, s) for s in presented]
    assert [(r.reason, r.token_id, str(r)) for r in refusals] == [
        ("unknown", None, "join token refused")
    ] * len(presented)
    assert uses(conn, token.id) == 0
    # A wrong secret says nothing about the token's state either.
    with conn.transaction():
        tokens.revoke(conn, token.id, ADMIN)
    assert refusal(conn, wrong_secret).reason == "unknown"
    assert refusal(conn, string).reason == "revoked"


def test_refusals_are_audited_only_through_record_refusal(
    conn: psycopg.Connection[Any],
) -> None:
    token, string = new_token(conn, max_uses=1)
    consume(conn, string)
    before = conn.execute("SELECT count(*) FROM audit_log").fetchone()
    used_up = refusal(conn, string)
    unknown = refusal(conn, f"{UNKNOWN_ID}.whatever")
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == before

    server = audit.Actor("server", "server-1")
    with conn.transaction():
        tokens.record_refusal(conn, used_up, hostname="laptop-7", actor=server)
        tokens.record_refusal(conn, unknown, hostname="laptop-8", actor=server)
    assert audit_rows(conn, "node.join.refused") == [
        ("server", "server-1", f"token:{token.id}", {"reason": "used_up", "hostname": "laptop-7"}),
        ("server", "server-1", "token:unknown", {"reason": "unknown", "hostname": "laptop-8"}),
    ]


class SlowSelects:
    """A connection whose SELECTs take a while to come back: what a joining node's
    transaction does between reading the token and counting its use, drawn out so that
    every consumer reads the token before any has written."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn

    def execute(self, query: Any, params: Any = None) -> Any:
        cursor = self._conn.execute(query, params)
        if str(query).lstrip().upper().startswith("SELECT"):
            time.sleep(0.05)
        return cursor


def test_concurrent_joins_never_use_a_token_more_than_max_uses(
    cluster_files: ClusterFiles, conn: psycopg.Connection[Any]
) -> None:
    token, string = new_token(conn, max_uses=5)
    consumers = 20
    start = threading.Barrier(consumers)
    lock = threading.Lock()
    outcomes: list[str] = []

    def join() -> None:
        with psycopg.connect(cluster_files.main_db) as own:
            start.wait(timeout=30)
            try:
                with own.transaction():
                    tokens.consume(cast("psycopg.Connection[Any]", SlowSelects(own)), string)
                    time.sleep(0.05)  # the rest of the join, before the commit
                outcome = "joined"
            except tokens.TokenRefused as e:
                outcome = e.reason
        with lock:
            outcomes.append(outcome)

    threads = [threading.Thread(target=join) for _ in range(consumers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["joined"] * 5 + ["used_up"] * 15
    assert uses(conn, token.id) == 5


# --- the CLI against a running server ---------------------------------------------------


@pytest.fixture
def server_env(
    cluster_files: ClusterFiles, cluster_env: dict[str, str], start_server: StartServer
) -> dict[str, str]:
    """A server on 127.0.0.15 and a context pointing at it."""
    context = Context.load(cluster_files.context_path)
    dataclasses.replace(context, servers=(f"{ADDRESS}:8443",)).save()
    start_server(cluster_files, ADDRESS)
    return cluster_env


def one_line_error(result: Any) -> str:
    assert result.code == 1, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    return str(result.err)


def test_cli_creates_lists_and_revokes_tokens(
    cli: CliRunner, cluster_files: ClusterFiles, server_env: dict[str, str]
) -> None:
    created = cli(
        "token", "create", "--tenant", "default", "--ttl", "24h", "--max-uses", "5",
        "--label", "team=data", "--label", "site=eu-1", "--description", "data team laptops",
        "--json", env=server_env,
    )  # fmt: skip
    assert created.code == 0, created.err
    data = created.json()
    match = TOKEN_STRING.match(data["token"])
    assert match is not None and match[1] == data["id"]
    secret = match[2]
    assert (data["tenant"], data["uses"], data["max_uses"]) == ("default", 0, 5)
    assert data["labels"] == {"team": "data", "site": "eu-1"}
    assert data["description"] == "data team laptops"
    assert data["revoked"] is False and data["created_by"] == "operator:admin"
    lifetime = dt.datetime.fromisoformat(data["expires_at"]) - dt.datetime.fromisoformat(
        data["created_at"]
    )
    assert lifetime == dt.timedelta(hours=24)

    # Without --json: the token once, how a node uses it; defaults: 24h, one use.
    shown = cli("token", "create", "--tenant", "default", env=server_env)
    assert shown.code == 0, shown.err
    (plain,) = re.findall(r"tok-[0-9a-f]{12}\.[A-Za-z0-9_-]{43}", shown.out.split("\n")[2])
    # The join command, on its own last line: it starts the file it downloaded when the
    # server has one to serve, else an installed oz0-node.
    join = shown.out.rstrip("\n").splitlines()[-1]
    started = re.search(r"OZ0_JOIN_TOKEN=(\S+) (exec \./)?oz0-node start --ca-hash (\S+) ", join)
    assert started is not None, join
    assert started.group(1) == plain and started.group(3) == cluster_files.ca_hash
    assert "--token " not in shown.out
    assert "only time the token is shown" in shown.out
    assert shown.out.startswith(f"token {plain.split('.')[0]} created for tenant default: ")
    assert "up to 1 use, expires " in shown.out
    forever = cli(
        "token", "create", "--tenant", "default", "--ttl", "0", "--max-uses", "0", "--json",
        env=server_env,
    ).json()  # fmt: skip
    assert (forever["expires_at"], forever["max_uses"]) == (None, 0)

    # The strings work: a node's join counts a use.
    with psycopg.connect(cluster_files.main_db) as conn, conn.transaction():
        assert tokens.consume(conn, data["token"]).uses == 1
        assert tokens.consume(conn, plain).uses == 1

    listed = cli("token", "list", "--json", env=server_env)
    assert listed.code == 0, listed.err
    rows = listed.json()
    plain_id = plain.split(".")[0]
    assert [t["id"] for t in rows] == [data["id"], plain_id, forever["id"]]
    # What the list holds of it: all that create answered but the secret and the command.
    secret_free = {k: v for k, v in data.items() if k not in ("token", "join_command")}
    assert rows[0] == {k: v for k, v in secret_free.items() if k != "agent_sha256"} | {"uses": 1}
    assert secret not in listed.out and plain.split(".")[1] not in listed.out

    table = cli("token", "list", env=server_env)
    assert table.code == 0, table.err
    lines = table.out.splitlines()
    assert lines[0].split() == [
        "ID", "TENANT", "USES", "MAX", "USES", "EXPIRES", "LABELS", "DESCRIPTION", "REVOKED"
    ]  # fmt: skip
    by_id = {line.split()[0]: line for line in lines[1:]}
    expires = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ"
    row = rf"\b1\s+5\s+{expires}\s+site=eu-1,team=data\s+data team laptops\s+no$"
    assert re.search(row, by_id[data["id"]]), by_id[data["id"]]
    assert re.search(r"\b0\s+unlimited\s+never\s+no$", by_id[forever["id"]])
    assert secret not in table.out

    revoked = cli("token", "revoke", data["id"], "--json", env=server_env)
    assert revoked.code == 0, revoked.err
    assert revoked.json()["revoked"] is True and revoked.json()["revoked_at"] is not None
    assert cli("token", "list", "--json", env=server_env).json()[0]["revoked"] is True
    plain_revoke = cli("token", "revoke", plain_id, env=server_env)
    assert (plain_revoke.code, plain_revoke.out) == (
        0,
        f"token {plain_id} revoked; nodes that joined with it stay\n",
    )
    assert one_line_error(cli("token", "revoke", data["id"], env=server_env)) == (
        f"error: token {data['id']} is already revoked\n"
    )

    audit_created = cli("audit", "list", "--action", "token.create", "--json", env=server_env)
    entries = {e["target"]: e for e in audit_created.json()}
    entry = entries[f"token:{data['id']}"]
    assert entry["actor"] == {"kind": "operator", "name": "admin"}
    assert entry["details"] == {
        "tenant": "default",
        "max_uses": 5,
        "expires_at": data["expires_at"],
        "labels": {"team": "data", "site": "eu-1"},
        "description": "data team laptops",
    }
    assert len(entries) == 3
    audit_revoked = cli("audit", "list", "--action", "token.revoke", "--json", env=server_env)
    assert [(e["actor"], e["target"]) for e in audit_revoked.json()] == [
        ({"kind": "operator", "name": "admin"}, f"token:{plain_id}"),
        ({"kind": "operator", "name": "admin"}, f"token:{data['id']}"),
    ]
    for text in (audit_created.out, audit_revoked.out):
        assert secret not in text and plain.split(".")[1] not in text


def test_cli_bad_input_is_one_line_on_stderr_and_creates_nothing(
    cli: CliRunner, server_env: dict[str, str]
) -> None:
    def create(*args: str) -> str:
        return one_line_error(cli("token", "create", *args, env=server_env))

    assert create("--tenant", "nope") == "error: tenant nope does not exist\n"
    assert create("--tenant", "default", "--ttl", "1x").startswith("error: invalid ttl '1x': ")
    assert create("--tenant", "default", "--max-uses", "-1").startswith(
        "error: invalid max uses -1: "
    )
    assert create("--tenant", "default", "--label", "team") == (
        "error: invalid label 'team': use KEY=VALUE, such as team=data\n"
    )
    assert create("--tenant", "default", "--label", "=x").startswith("error: invalid label '=x'")
    assert create("--tenant", "default", "--label", "Team=x").startswith(
        "error: invalid label key 'Team': "
    )
    assert create("--tenant", "default", "--label", "a=1", "--label", "a=2") == (
        "error: label a is given more than once\n"
    )
    assert one_line_error(cli("token", "revoke", UNKNOWN_ID, env=server_env)) == (
        f"error: token {UNKNOWN_ID} not found\n"
    )
    assert one_line_error(cli("token", "revoke", "tok-x/../y", env=server_env)).startswith(
        "error: invalid token id 'tok-x/../y': "
    )
    assert cli("token", "list", "--json", env=server_env).json() == []
    assert cli("audit", "list", "--action", "token.create", "--json", env=server_env).json() == []
