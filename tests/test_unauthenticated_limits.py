"""What a peer that has not authenticated can make a server hold, on 7443 and 8443: every
phase has a deadline, connections are capped per source address and in total, messages
in size and nesting (issue 9, item 5)."""

from __future__ import annotations

import json
import re
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import trio
from trio_websocket import ConnectionClosed

from fixtures import edge_client, metrics, strangers
from fixtures.agent import AgentProcess, connected
from fixtures.cluster import ClusterFiles, ServerProcess, StartServer
from fixtures.edge_client import NodeKeys
from fixtures.tls import as_our_client
from oz0.server.admission import MAX_PER_ADDRESS
from tests.conftest import CliRunner, create_token

SERVER = "127.0.0.81"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
EDGE_PORT, MANAGEMENT_PORT = 7443, 8443
SILENT_ON_EDGE, SILENT_ON_MANAGEMENT = 500, 100


def streams_up(agent: AgentProcess) -> int:
    return agent.log().count("control stream up:")


def source(i: int, per_address: int = 50) -> str:
    """Source addresses for the silent crowd, 50 a piece: under the per-address cap."""
    return f"127.0.0.{100 + i // per_address}"


def no_errors(server: ServerProcess) -> None:
    log = server.own_log()
    assert "Traceback" not in log and " ERROR " not in log, log[-3000:]


async def test_silent_clients_are_closed_within_15_s_while_nodes_stay_and_join(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    strangers.raise_open_file_limit()
    server = start_server(cluster_files, SERVER)
    staying = AgentProcess.joining(
        tmp_path / "staying", [EDGE], cluster_files.ca_hash, token=create_token(cli, cluster_env)
    ).start()
    agents.append(staying)
    before = await trio.to_thread.run_sync(staying.wait_status, connected, 30)
    arriving_token = create_token(cli, cluster_env)

    ctx = strangers.unverified()
    open_for: list[float] = []
    handshaken = trio.Semaphore(0)
    limit = trio.CapacityLimiter(64)

    async def silent(port: int, src: str) -> None:
        async with limit:
            stream = await strangers.open_tls(SERVER, port, src, ctx)
        began = trio.current_time()
        handshaken.release()
        await strangers.wait_closed(stream)
        open_for.append(trio.current_time() - began)
        await trio.aclose_forcefully(stream)

    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            for i in range(SILENT_ON_EDGE):
                nursery.start_soon(silent, EDGE_PORT, source(i))
            for i in range(SILENT_ON_MANAGEMENT):
                nursery.start_soon(silent, MANAGEMENT_PORT, source(i))
            for _ in range(SILENT_ON_EDGE + SILENT_ON_MANAGEMENT):
                await handshaken.acquire()
            # Every stranger holds its connection now: a new node must still get in.
            arriving = AgentProcess.joining(
                tmp_path / "arriving", [EDGE], cluster_files.ca_hash, token=arriving_token
            ).start()
            agents.append(arriving)
    assert len(open_for) == SILENT_ON_EDGE + SILENT_ON_MANAGEMENT
    assert max(open_for) < 15, sorted(open_for)[-5:]

    await trio.to_thread.run_sync(arriving.wait_status, connected, 30)
    after = await trio.to_thread.run_sync(staying.wait_status, connected, 10)
    assert after["server"] == before["server"]
    assert streams_up(staying) == 1, staying.log()
    no_errors(server)


async def test_one_address_over_its_cap_is_closed_at_once_another_still_gets_in(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    strangers.raise_open_file_limit()
    server = start_server(cluster_files, SERVER)
    ctx = strangers.unverified()
    greedy, other = "127.0.0.90", "127.0.0.91"
    extra = 10
    for port in (EDGE_PORT, MANAGEMENT_PORT):
        held = [await strangers.open_tls(SERVER, port, greedy, ctx) for _ in range(MAX_PER_ADDRESS)]
        try:
            for _ in range(extra):
                with trio.fail_after(3):  # at once, not after a handshake deadline
                    with pytest.raises(trio.BrokenResourceError):
                        stream = await strangers.open_tls(SERVER, port, greedy, ctx)
                        await strangers.wait_closed(stream)
                        raise trio.BrokenResourceError("closed after the handshake")
            if port == EDGE_PORT:
                async with strangers.websocket(SERVER, port, other, "/join", ctx) as (_, hello):
                    assert hello["type"] == "hello"
            else:
                status, body = await http_request(SERVER, port, other, "GET", "/api/v1/cluster")
                assert status == 401 and "operator client certificate" in body["error"]
        finally:
            for stream in held:
                await trio.aclose_forcefully(stream)
    # Counted and logged at a bounded rate: one line per listener for the whole burst.
    reports = re.findall(r"closed (\d+) unauthenticated connection", server.stderr())
    assert reports == ["1", "1"], server.stderr()[-2000:]
    # And every one of them counted for /metrics, by listener.
    samples = metrics.scrape(SERVER)
    assert metrics.value(samples, "oz0_edge_connections_over_limit_total") == extra
    assert metrics.value(samples, "oz0_management_connections_over_limit_total") == extra
    no_errors(server)


async def test_a_peer_that_never_answers_our_close_frame_is_cut_off_within_5_s(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    server = start_server(cluster_files, SERVER)
    stream = await strangers.open_tls(SERVER, EDGE_PORT, "127.0.0.92", strangers.unverified())
    deaf = strangers.DeafWebsocket(stream, SERVER, "/join")
    with trio.fail_after(10):
        await deaf.open()
        hello = await deaf.next_text()
        assert hello is not None and json.loads(hello)["type"] == "hello"
        await deaf.send_text(json.dumps({"type": "nonsense"}))
        answer = await deaf.next_text()
    assert answer is not None and json.loads(answer)["code"] == "bad_request"
    began = trio.current_time()
    try:
        with trio.fail_after(15):
            assert await deaf.next_text() is None, "a close frame"
            await strangers.wait_closed(stream)
    finally:
        await trio.aclose_forcefully(stream)
    assert trio.current_time() - began < 8
    no_errors(server)


async def test_big_and_deep_messages_are_refused_clearly(
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    cli: CliRunner,
    start_server: StartServer,
) -> None:
    server = start_server(cluster_files, SERVER)
    ctx = strangers.unverified()
    deep = "[" * 30_000 + "]" * 30_000
    async with strangers.websocket(SERVER, EDGE_PORT, "127.0.0.93", "/join", ctx) as (ws, _):
        await ws.send_message(deep)
        with trio.fail_after(10):
            answer = json.loads(await ws.get_message())
        assert answer == {
            "type": "error",
            "code": "bad_request",
            "message": "messages must not be nested this deeply",
        }
    async with strangers.websocket(SERVER, EDGE_PORT, "127.0.0.93", "/join", ctx) as (ws, _):
        await ws.send_message(json.dumps({"type": "join", "csr": "x" * 70_000}))
        with trio.fail_after(10), pytest.raises(ConnectionClosed) as closed:
            await ws.get_message()
        assert closed.value.reason is not None
        assert closed.value.reason.code == 1009  # message too big

    # A node's live control stream shrugs both off and goes on.
    keys = NodeKeys.new()
    keys.ca_pem, _ = await edge_client.fetch_ca(EDGE)
    joined = await edge_client.join(EDGE, keys, token=create_token(cli, cluster_env))
    assert joined["state"] == "accepted"
    async with edge_client.control(EDGE, keys) as (ws, welcome):
        assert welcome["type"] == "welcome"
        await ws.send_message(deep)
        await edge_client.send(ws, "heartbeat")
        with trio.fail_after(10):
            assert json.loads(await ws.get_message())["type"] == "heartbeat"

    # The management API: 400 and 413 in its own JSON, from an operator too.
    for body, status, said in (
        (deep, 400, "must be a JSON object"),
        ("{" + " " * 70_000 + "}", 413, "Request Entity Too Large"),
    ):
        code, answer_body = await trio.to_thread.run_sync(
            partial(curl_post, cluster_files, "/api/v1/tokens", body)
        )
        assert code == status and said in answer_body["error"], (code, answer_body)
    no_errors(server)


def curl_post(files: ClusterFiles, path: str, body: str) -> tuple[int, Any]:
    """POST BODY to PATH with the admin's certificate; the status and the JSON answer."""
    context = files.context_dir
    done = subprocess.run(
        [
            "curl", "--silent", "--show-error", "--max-time", "10",
            "--cacert", str(context / "ca.crt"),
            "--cert", str(context / "operator.crt"),
            "--key", str(context / "operator.key"),
            "--header", "Content-Type: application/json", "--data-binary", "@-",
            "--write-out", "\n%{http_code}",
            *as_our_client(f"https://{SERVER}:{MANAGEMENT_PORT}{path}"),
        ],
        input=body, capture_output=True, text=True, check=True, timeout=15,
    )  # fmt: skip
    text, _, code = done.stdout.rpartition("\n")
    return int(code), json.loads(text)


async def http_request(
    address: str, port: int, src: str, method: str, path: str
) -> tuple[int, dict[str, Any]]:
    """One HTTP/1.1 request without a client certificate, from SRC."""
    stream = await strangers.open_tls(address, port, src, strangers.unverified())
    try:
        request = f"{method} {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n"
        await stream.send_all(request.encode())
        received = b""
        with trio.fail_after(10):
            try:
                while chunk := await stream.receive_some(65536):
                    received += chunk
            except strangers.CLOSED_ERRORS:
                pass
    finally:
        await trio.aclose_forcefully(stream)
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)
