"""The caps on one person and one tenant through a real server on 127.0.0.78, started with
small limits: each refused past its limit in one line naming the limit and its flag (429,
422 for a schedule that runs too often), and another person, or another tenant, not
refused meanwhile. Requests a second (the CLI's API and the web UI's pages alike), web
sessions and live pages per person; schedules, their shortest interval and live join
tokens per tenant.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

from cli import client
from fixtures import metrics, operator_certs
from fixtures.cluster import Served
from fixtures.polling import wait_until
from oz0 import passwords
from tests.conftest import CliRunner

SERVER = "127.0.0.78"
ADVERTISE = SERVER  # the module's server (`served`, tests/conftest.py)
ORIGIN = f"https://{SERVER}:8443"
RATE, BURST = 2, 30
SERVER_ARGS = (
    "--max-web-sessions-per-person", "2",
    "--max-live-pages-per-person", "2",
    "--person-requests-per-second", str(RATE),
    "--person-request-burst", str(BURST),
)  # fmt: skip
WEB_PASSWORD = "a long enough web password"
NEVER = "0 0 1 1 *"


@dataclass(frozen=True)
class Answer:
    status: int
    data: dict[str, Any]
    headers: http.client.HTTPMessage


class Api:
    """An operator's calls to the API over one kept connection."""

    def __init__(self, tls: ssl.SSLContext) -> None:
        self.https: http.client.HTTPSConnection = client.connection(SERVER, 8443, tls, timeout=30)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Answer:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        self.https.request(method, path, json.dumps(body) if body is not None else None, headers)
        answer = self.https.getresponse()
        return Answer(answer.status, json.loads(answer.read()), answer.headers)

    def ok(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        answer = self.call(method, path, body)
        assert answer.status < 300, (method, path, answer.status, answer.data)
        return answer.data


class Web:
    """A browser's requests to the web UI, trusting the web UI CA."""

    def __init__(self, ui_ca: str) -> None:
        self.tls = ssl.create_default_context(cadata=ui_ca)

    def connected(self) -> http.client.HTTPSConnection:
        """A connection, its TLS handshake done: a request on it is sent at once."""
        https = http.client.HTTPSConnection(SERVER, 8443, context=self.tls, timeout=30)
        https.connect()
        return https

    def request(
        self,
        method: str,
        path: str,
        cookie: str = "",
        form: dict[str, str] | None = None,
        https: http.client.HTTPSConnection | None = None,
    ) -> tuple[http.client.HTTPSConnection, http.client.HTTPResponse]:
        https = https or self.connected()
        headers = {"Origin": ORIGIN, "Accept": "text/html", "Cookie": cookie}
        body = None
        if form is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urllib.parse.urlencode(form)
        https.request(method, path, body, headers)
        return https, https.getresponse()

    def page(self, method: str, path: str, cookie: str = "", **form: str) -> tuple[int, str]:
        https, answer = self.request(method, path, cookie, form or None)
        try:
            return answer.status, answer.read().decode()
        finally:
            https.close()

    def sign_in(self, name: str, password: str) -> tuple[int, str, str]:
        """Status, page and the session's cookie (empty if none)."""
        https, answer = self.request(
            "POST", "/sign-in", form={"username": name, "password": password}
        )
        try:
            cookie = (answer.getheader("Set-Cookie") or "").split(";", 1)[0]
            return answer.status, answer.read().decode(), cookie
        finally:
            https.close()


@dataclass(frozen=True)
class World:
    served: Served
    admin: Api
    alice: Api
    web: Web

    def db(self) -> psycopg.Connection[Any]:
        url = self.served.files.url
        return psycopg.connect(url.for_database(url.names.main), autocommit=True)


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    files = served.files
    admin_tls = ssl.create_default_context(cafile=str(files.context_dir / "ca.crt"))
    admin_tls.check_hostname = False
    admin_tls.load_cert_chain(
        str(files.context_dir / "operator.crt"), str(files.context_dir / "operator.key")
    )
    alice = operator_certs.issue(
        files, "alice", tmp_path_factory.mktemp("alice") / "ctx", SERVER, role="operator"
    )
    url = files.url
    with psycopg.connect(url.for_database(url.names.main), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ui_accounts (username, password_hash) VALUES ('alice', %s)",
            (passwords.hash_password(WEB_PASSWORD),),
        )
        row = conn.execute("SELECT ui_ca_cert FROM cluster").fetchone()
    assert row is not None
    one = World(served, Api(admin_tls), Api(alice.ssl_context()), Web(row[0]))
    yield one
    one.admin.https.close()
    one.alice.https.close()


def one_line_naming(text: str, *flags: str) -> None:
    assert "\n" not in text.strip(), text
    for flag in flags:
        assert flag in text, text


def caps_hit(cap: str) -> float:
    """This server's `oz0_person_caps_hit_total` for CAP."""
    return metrics.value(metrics.scrape(SERVER), "oz0_person_caps_hit_total", cap=cap) or 0


def counted(cap: str, total: float) -> None:
    """The refusals past CAP counted in the metrics come to TOTAL (the scrape's text is
    made at most once a second)."""
    wait_until(lambda: caps_hit(cap) == total, 5, f"{total:g} refusals past {cap}", step=0.3)


def test_a_persons_requests_past_the_rate_are_refused_and_anothers_are_not(
    world: World,
) -> None:
    hit = caps_hit("requests")
    status, _, cookie = world.web.sign_in("alice", WEB_PASSWORD)
    assert status == 303
    answers = [world.alice.call("GET", "/api/v1/cluster") for _ in range(2 * BURST)]
    statuses = [a.status for a in answers]
    # The burst passes; past it, refused (a few more pass as the bucket refills).
    assert statuses[:BURST] == [200] * BURST, statuses
    assert statuses.count(429) >= BURST // 2, statuses
    refused = next(a for a in answers if a.status == 429)
    assert refused.headers["Retry-After"] == "1"
    one_line_naming(
        refused.data["error"],
        f"alice sent more than {BURST} requests at once or {RATE} a second",
        "--person-requests-per-second", "--person-request-burst",
    )  # fmt: skip
    # Another person is not slowed: answered at once.
    began = time.monotonic()
    assert world.admin.call("GET", "/api/v1/cluster").status == 200
    assert time.monotonic() - began < 2.0
    # The web UI's pages take from the same bucket: alice's are refused too, in a page.
    ready = world.web.connected()
    while world.alice.call("GET", "/api/v1/cluster").status != 429:
        pass  # the bucket refilled meanwhile: empty again, then ask at once
    _, answer = world.web.request("GET", "/overview", cookie, https=ready)
    page = answer.read().decode()
    ready.close()
    assert answer.status == 429, page[:500]
    assert "alice sent more than" in page
    # Waited for, the rate lets the next one through.
    time.sleep(int(refused.headers["Retry-After"]))
    assert world.alice.call("GET", "/api/v1/cluster").status == 200
    # Each refusal counted: the API's, the last one asked at once, the web UI's page.
    counted("requests", hit + statuses.count(429) + 2)


def test_a_sign_in_past_a_persons_open_sessions_is_refused(world: World) -> None:
    with world.db() as conn:
        conn.execute("DELETE FROM ui_sessions")
    hit = caps_hit("web_sessions")
    password = world.served.files.ui_password
    cookies = []
    for _ in range(2):
        status, _, cookie = world.web.sign_in("admin", password)
        assert status == 303
        cookies.append(cookie)
    status, page, cookie = world.web.sign_in("admin", password)
    assert (status, cookie) == (429, "")
    assert (
        "admin has 2 web sessions open, the limit per person (server start"
        " --max-web-sessions-per-person); sign out of one, or wait until one has been idle"
        " 30 minutes" in page
    )
    counted("web_sessions", hit + 1)
    # Another person signs in meanwhile.
    assert world.web.sign_in("alice", WEB_PASSWORD)[0] == 303
    # One signed out, there is room again.
    https, answer = world.web.request("GET", "/account", cookies[0])
    csrf = answer.read().decode().split('name="csrf" value="', 1)[1].split('"', 1)[0]
    https.close()
    assert world.web.page("POST", "/sign-out", cookies[0], csrf=csrf)[0] == 303
    assert world.web.sign_in("admin", password)[0] == 303


def test_a_persons_live_pages_past_the_cap_are_refused_whatever_the_session(
    world: World,
) -> None:
    with world.db() as conn:
        conn.execute("DELETE FROM ui_sessions")
    hit = caps_hit("live_pages")
    password = world.served.files.ui_password
    first, second = (world.web.sign_in("admin", password)[2] for _ in range(2))
    alices = world.web.sign_in("alice", WEB_PASSWORD)[2]
    held = []
    try:
        for cookie in (first, second):
            https, answer = world.web.request("GET", "/ui/events?nodes=", cookie)
            held.append(https)
            assert answer.status == 200
            assert answer.read1(100).startswith(b"retry:")  # its slot is taken
        # A third from the first session, which holds one of its 10: the person's cap.
        https, answer = world.web.request("GET", "/ui/events?nodes=", first)
        held.append(https)
        assert answer.status == 429  # before its body: a stream let in would never end
        assert answer.read().decode() == (
            "admin has 2 live pages open on this server, the limit per person (server start"
            " --max-live-pages-per-person); close some and reload"
        )
        counted("live_pages", hit + 1)
        # Another person's page opens.
        https, answer = world.web.request("GET", "/ui/events?nodes=", alices)
        held.append(https)
        assert answer.status == 200
        assert answer.read1(100).startswith(b"retry:")
    finally:
        for https in held:
            https.close()


def schedule(tenant: str, **when: Any) -> dict[str, Any]:
    return {**when, "job": {"tenant": tenant, "command": ["true"]}}


@pytest.mark.slow
def test_schedules_past_a_tenants_cap_or_too_often_are_refused(world: World) -> None:
    admin = world.admin
    admin.ok("POST", "/api/v1/tenants", {"name": "other"})
    changed = admin.ok(
        "PATCH", "/api/v1/tenants/default", {"max_schedules": 2, "min_schedule_interval": "10s"}
    )
    assert (changed["max_schedules"], changed["min_schedule_interval"]) == (2, "10s")
    every = admin.ok("POST", "/api/v1/schedules", schedule("default", every=10))
    admin.ok("POST", "/api/v1/schedules", schedule("default", cron=NEVER))
    third = admin.call("POST", "/api/v1/schedules", schedule("default", cron=NEVER))
    assert third.status == 429
    assert third.data["error"] == (
        "tenant default has 2 schedules, its limit (tenant set --max-schedules); delete one first"
    )
    # Another tenant's schedules are its own.
    admin.ok("POST", "/api/v1/schedules", schedule("other", every=60))  # its own minimum
    admin.ok("DELETE", f"/api/v1/schedules/{every['id']}")

    # Too often, as an interval or as a cron expression's runs (Temporal's own reading).
    for when, said in (
        ({"every": 5}, "every 5s runs 5s apart"),
        ({"cron": "*/5 * * * * * *"}, "cron '*/5 * * * * * *' (UTC) runs 5s apart"),
        ({"cron": "@every 2s"}, "cron '@every 2s' (UTC) runs 2s apart"),
    ):
        refused = admin.call("POST", "/api/v1/schedules", schedule("default", **when))
        assert refused.status == 422, refused.data
        assert refused.data["error"] == (
            f"{said}, more often than tenant default allows: at least 10s between runs"
            " (tenant set --min-schedule-interval)"
        )
    admin.ok("POST", "/api/v1/schedules", schedule("default", cron="*/10 * * * * * *"))
    # Nothing of the refused ones is left: two schedules, and no Temporal Schedule beside.
    listed = admin.ok("GET", "/api/v1/schedules?tenant=default")["schedules"]
    assert len(listed) == 2
    assert all(s["temporal"] and s["temporal"]["found"] for s in listed), listed


def test_join_tokens_past_a_tenants_cap_are_refused(world: World, cli: CliRunner) -> None:
    admin = world.admin
    with world.db() as conn:
        conn.execute("DELETE FROM join_tokens")
        if conn.execute("SELECT 1 FROM tenants WHERE name = 'other'").fetchone() is None:
            conn.execute("INSERT INTO tenants (name) VALUES ('other')")
    admin.ok("PATCH", "/api/v1/tenants/default", {"max_join_tokens": 2})
    made = [admin.ok("POST", "/api/v1/tokens", {"tenant": "default"}) for _ in range(2)]
    refused = admin.call("POST", "/api/v1/tokens", {"tenant": "default"})
    assert refused.status == 429
    assert refused.data["error"] == (
        "tenant default has 2 live join tokens, its limit (tenant set --max-join-tokens);"
        " revoke one first"
    )
    admin.ok("POST", "/api/v1/tokens", {"tenant": "other"})
    # The CLI says the same line, and fails.
    env = world.served.files.cli_env
    refused_cli = cli("token", "create", "--tenant", "default", env=env)
    assert refused_cli.code == 1
    assert refused_cli.err.strip().endswith(refused.data["error"]), refused_cli.err
    admin.ok("POST", f"/api/v1/tokens/{made[0]['id']}/revoke", {})
    admin.ok("POST", "/api/v1/tokens", {"tenant": "default"})
    # And `tenant show` shows the caps.
    shown = cli("tenant", "show", "default", env=env)
    assert "max join tokens" in shown.out and "min schedule interval" in shown.out, shown.out


def test_each_cap_is_a_flag_its_help_shows_with_its_default() -> None:
    wide = {**os.environ, "COLUMNS": "300"}
    for args, wanted in (
        (("server", "start", "--help"), {
            "--max-web-sessions-per-person": "20", "--max-live-pages-per-person": "20",
            "--max-event-streams-per-person": "5",
            "--person-requests-per-second": "50.0", "--person-request-burst": "200",
        }),
        (("tenant", "create", "--help"), {
            "--max-schedules": "100", "--min-schedule-interval": "1m",
            "--max-join-tokens": "100",
        }),
    ):  # fmt: skip
        shown = subprocess.run(
            [sys.executable, "-m", "cli.main", *args], capture_output=True, text=True,
            check=True, env=wide,
        ).stdout  # fmt: skip
        for flag, default in wanted.items():
            line = next((x for x in shown.splitlines() if f" {flag} " in x), "")
            assert re.search(rf"default:? {re.escape(default)}\b", line), (flag, line)
