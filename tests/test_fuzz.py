"""Malformed and mutated join, control and management-API messages against one real server
(issue 9, Fuzz): it keeps answering, each answer is a clear refusal, its log shows no
error or traceback and its memory stays bounded."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from trio_websocket import ConnectionClosed, WebSocketConnection

from cli import client
from fixtures import edge_client
from fixtures.cluster import ClusterFiles, StartServer, initialise
from fixtures.edge_client import NodeKeys
from oz0.server.edge.common import MAX_MESSAGE_SIZE
from oz0.store.dburl import DatabaseUrl
from tests.conftest import CliRunner

SERVER = "127.0.0.83"
EDGE = f"{SERVER}:7443"
MAX_PENDING = 5
RSS_GROWTH_LIMIT = 64 * 1024 * 1024

# Close codes that are themselves a clear answer: too big, or a protocol violation.
REFUSING_CLOSES = {1002, 1003, 1007, 1008, 1009}
REFUSALS = {"error", "refused", "rejected", "pending"}


class Message:
    """What one websocket message carries, shown short when hypothesis reports it (not a
    dataclass: hypothesis would print its fields in full)."""

    def __init__(self, data: str | bytes) -> None:
        self.data = data

    def __repr__(self) -> str:
        shown = repr(self.data)
        return shown if len(shown) <= 300 else f"{shown[:300]}... ({len(self.data)} long)"


def fuzz_settings(examples: int) -> settings:
    return settings(
        max_examples=examples,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )


scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
strings = st.text(max_size=80) | st.sampled_from(
    ["", "\x00", "node-000000000000", "tok-000000000000.x", "-----BEGIN CERTIFICATE REQUEST-----"]
)
deep = st.integers(min_value=900, max_value=30_000).map(lambda n: "[" * n + "]" * n)
too_big = st.integers(min_value=64 * 1024 + 1, max_value=256 * 1024).map(lambda n: "{" * n)


def mutated(text: str) -> st.SearchStrategy[str]:
    """TEXT with a few characters replaced, inserted or cut."""

    @st.composite
    def mutate(draw: st.DrawFn) -> str:
        chars = list(text)
        for _ in range(draw(st.integers(1, 8))):
            at = draw(st.integers(0, max(0, len(chars) - 1)))
            action = draw(st.sampled_from(["replace", "insert", "cut"]))
            char = draw(st.characters())
            if action == "replace" and chars:
                chars[at] = char
            elif action == "insert":
                chars.insert(at, char)
            elif chars:
                del chars[at : at + draw(st.integers(1, 20))]
        return "".join(chars)

    return mutate()


def join_messages(csr: str) -> st.SearchStrategy[Message]:
    valid_join = json.dumps(
        {"type": "join", "csr": csr, "labels": {"os": "linux"}, "hostname": "h"}
    )
    valid_pickup = json.dumps(
        {"type": "pickup", "node_id": "node-000000000000", "signature": "AA=="}
    )
    fields = st.fixed_dictionaries(
        {"type": st.sampled_from(["join", "pickup"]) | strings},
        optional={
            "csr": strings | json_values | mutated(csr),
            "token": strings | json_values,
            "labels": json_values | st.dictionaries(strings, strings, max_size=5),
            "hostname": strings | json_values,
            "node_id": strings | json_values,
            "signature": strings | json_values,
        },
    ).map(json.dumps)
    return (
        fields
        | mutated(valid_join)
        | mutated(valid_pickup)
        | json_values.map(json.dumps)
        | st.binary(max_size=300)
        | st.text(max_size=300)
        | deep
        | too_big
    ).map(Message)  # fmt: skip


control_messages = (
    st.fixed_dictionaries(
        {"type": st.sampled_from(["purged", "purge_refused", "heartbeat", "hello"]) | strings},
        optional={"nonce": strings | json_values, "reason": strings | json_values},
    ).map(json.dumps)
    | json_values.map(json.dumps)
    | st.binary(max_size=200)
    | st.text(max_size=200)
    | deep
).map(Message)
# (Messages over the size limit end a control stream: that is checked on /join.)

API_PATHS = [
    "/api/v1/cluster",
    "/api/v1/audit",
    "/api/v1/nodes",
    "/api/v1/nodes/{}",
    "/api/v1/nodes/{}/accept",
    "/api/v1/nodes/{}/reject",
    "/api/v1/nodes/{}/block",
    "/api/v1/nodes/{}/unblock",
    "/api/v1/nodes/{}/purge",
    "/api/v1/tokens",
    "/api/v1/tokens/{}/revoke",
    "/api/v1/tenants",
    "/api/v1/nowhere",
]


def as_sent(text: str) -> bytes:
    """TEXT's bytes, a lone surrogate (which st.characters() draws) as the bytes it would
    be, not UTF-8 at all: a body no client should send, which the API must refuse cleanly.
    Encoded strictly, one failed the test while it was generating the request."""
    return text.encode("utf-8", "surrogatepass")


@st.composite
def api_requests(draw: st.DrawFn) -> tuple[str, str, Message]:
    path = draw(st.sampled_from(API_PATHS))
    if "{}" in path:
        path = path.format(draw(st.text(alphabet="abcdefz0123456789-%._~", max_size=20)))
    if draw(st.booleans()):
        path += "?" + draw(st.text(alphabet="abcdefgz=&%0123456789", max_size=30))
    method = draw(st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH"]))
    body = draw(
        json_values.map(lambda v: json.dumps(v).encode())
        | st.binary(max_size=300)
        | deep.map(as_sent)
        | mutated('{"tenant": "default", "ttl": "1h", "max_uses": 1}').map(as_sent)
    )
    return method, path, Message(body)


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def operator_context(files: ClusterFiles, *, with_certificate: bool) -> ssl.SSLContext:
    context = files.context_dir
    ctx = ssl.create_default_context(cafile=str(context / "ca.crt"))
    ctx.check_hostname = False
    if with_certificate:
        ctx.load_cert_chain(str(context / "operator.crt"), str(context / "operator.key"))
    return ctx


def api_call(ctx: ssl.SSLContext, method: str, path: str, body: bytes) -> tuple[int, bytes]:
    conn = client.connection(SERVER, 8443, ctx, timeout=15)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def assert_clear_refusal(answer: dict[str, Any]) -> None:
    assert isinstance(answer, dict), answer
    assert answer.get("type") in REFUSALS | {"joined"}, answer
    if answer["type"] in ("error", "refused"):
        assert isinstance(answer.get("code"), str) and isinstance(answer.get("message"), str)
    if answer["type"] == "joined":
        assert answer["state"] == "pending", answer  # a mutation that still is a request


async def one_join_message(ca_pem: bytes, message: str | bytes) -> dict[str, Any] | None:
    """The edge's answer to MESSAGE on /join, or None if it closed with a refusing code."""
    ctx = edge_client.verified_context(ca_pem)
    async with edge_client.connect(EDGE, "/join", ctx) as (ws, _):
        try:
            await ws.send_message(message)
            return await edge_client.receive(ws)
        except ConnectionClosed as e:
            assert e.reason is not None
            if len(message) > MAX_MESSAGE_SIZE:
                # Closed while we were still sending: our side may see only the reset.
                assert e.reason.code in (1009, 1006), e.reason
            else:
                assert e.reason.code in REFUSING_CLOSES, e.reason
            return None


async def still_heartbeating(ws: WebSocketConnection) -> None:
    with trio.fail_after(15):
        while (await edge_client.receive(ws))["type"] != "heartbeat":
            pass


@pytest.mark.timeout(240)
def test_malformed_and_mutated_messages_get_clear_refusals(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl, start_server: StartServer
) -> None:
    files = initialise(tmp_path, pg_url, advertise=SERVER)
    env = files.cli_env
    server = start_server(files, SERVER, "--max-pending-nodes", str(MAX_PENDING))
    created = cli("token", "create", "--tenant", "default", "--json", env=env)
    assert created.code == 0, created.err
    node = NodeKeys.new()
    node.ca_pem, _ = trio.run(edge_client.fetch_ca, EDGE)
    joined = trio.run(lambda: edge_client.join(EDGE, node, token=created.json()["token"]))
    assert joined["state"] == "accepted"
    rss_before = rss(server.pid)
    csr = NodeKeys.new().csr_pem()
    stats = {"answers": 0, "closes": 0, "joined": 0, "api_answers": 0, "api_closes": 0}

    @fuzz_settings(1000)
    @given(join_messages(csr))
    def joins(message: Message) -> None:
        answer = trio.run(one_join_message, node.ca_pem, message.data)
        if answer is None:
            stats["closes"] += 1
            return
        assert_clear_refusal(answer)
        stats["answers"] += 1
        stats["joined"] += answer["type"] == "joined"

    async def control_on_one_stream() -> None:
        """Every example's messages on one live stream, which must outlive them all."""
        async with edge_client.control(EDGE, node) as (ws, welcome):
            assert welcome["type"] == "welcome"

            @fuzz_settings(120)
            @given(st.lists(control_messages, min_size=10, max_size=60))
            def control(messages: list[Message]) -> None:
                for message in messages:
                    trio.from_thread.run(ws.send_message, message.data)

            began = time.monotonic()
            await trio.to_thread.run_sync(control)
            print(f"control: {time.monotonic() - began:.1f} s")
            # Nothing a node sends unasked is answered; the stream goes on.
            await edge_client.send(ws, "heartbeat")
            await still_heartbeating(ws)

    operator = operator_context(files, with_certificate=True)
    stranger = operator_context(files, with_certificate=False)

    @fuzz_settings(700)
    @given(api_requests(), st.booleans())
    def management(request: tuple[str, str, Message], as_operator: bool) -> None:
        method, path, body = request
        assert isinstance(body.data, bytes)
        try:
            status, raw = api_call(operator if as_operator else stranger, method, path, body.data)
        except (ssl.SSLError, ConnectionError):
            # Refused before the body was read (401, 404): the server closes rather than
            # read it, and our send can fail before we read the answer.
            assert body.data, "a request without a body is answered"
            stats["api_closes"] += 1
            return
        stats["api_answers"] += 1
        assert status < 500, (status, raw[:300])
        if status >= 400:
            error = json.loads(raw)["error"]
            assert isinstance(error, str) and error
        if not as_operator:
            assert status in (401, 404, 405, 413), (status, raw[:300])

    began = time.monotonic()
    joins()
    print(f"joins: {time.monotonic() - began:.1f} s")
    trio.run(control_on_one_stream)
    began = time.monotonic()
    management()
    print(f"management: {time.monotonic() - began:.1f} s; {stats}")

    assert server.process is not None and server.process.poll() is None, "the server still runs"
    assert trio.run(edge_client.fetch_ca, EDGE)[0] == node.ca_pem, "the edge still answers"
    assert api_call(operator, "GET", "/api/v1/cluster", b"")[0] == 200, "so does the API"
    assert stats["answers"] > 800 and stats["closes"] > 0, stats
    assert stats["joined"] <= MAX_PENDING, stats
    assert stats["api_answers"] > 10 * stats["api_closes"], stats
    audit = cli("audit", "list", "--action", "node.purge.refused", "--json", env=env)
    assert audit.json() == [], "unsolicited purge refusals are not audited"
    growth = rss(server.pid) - rss_before
    assert growth < RSS_GROWTH_LIMIT, f"RSS grew by {growth / 2**20:.0f} MiB"
    log = server.own_log()
    assert "Traceback" not in log and " ERROR " not in log, log[-5000:]
