"""The CLI's client keeps a connection for a command's next request and resumes the TLS
session on a new one, against a real server on 127.0.0.222."""

from __future__ import annotations

import dataclasses
import datetime as dt
import ssl
import subprocess
from pathlib import Path

import pytest

from cli import client as client_module
from cli.client import ApiClient
from fixtures.cluster import ClusterFiles, StartServer
from oz0.context import Context
from oz0_common.certs import API_SERVER_NAME

SERVER = "127.0.0.222"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises


def test_one_connection_serves_a_command_s_requests_and_a_new_one_resumes_tls(
    cluster_files: ClusterFiles, start_server: StartServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    start_server(cluster_files, SERVER)
    handshakes: list[bool | None] = []  # for each new connection: whether it resumed a session
    connect = client_module._Connection.connect

    def counted(self: client_module._Connection) -> None:
        connect(self)
        assert isinstance(self.sock, ssl.SSLSocket)
        handshakes.append(self.sock.session_reused)

    monkeypatch.setattr(client_module._Connection, "connect", counted)
    context = Context.load(cluster_files.context_path)
    # Servers learned long ago: the command's request is followed by a refresh of them.
    stale = dataclasses.replace(context, learned_at=dt.datetime(2020, 1, 1, tzinfo=dt.UTC))
    stale.save()
    api = ApiClient(stale)
    api.get("/api/v1/nodes")
    assert Context.load(cluster_files.context_path).learned_at != stale.learned_at, "no refresh"
    assert handshakes == [False], "the refresh did not reuse the request's connection"
    api.post("/api/v1/tenants", {"name": "acme"})
    assert handshakes == [False]

    # A new connection (the last one closed) resumes the session: no full handshake.
    api.close()
    api.get("/api/v1/nodes")
    assert handshakes == [False, True]

    # One idle for longer than KEEP_IDLE is not risked: the next request goes on a new one.
    server = f"{SERVER}:8443"
    ((kept, since),) = api._idle[server]
    api._idle[server] = [(kept, since - client_module.KEEP_IDLE)]
    api.get("/api/v1/nodes")
    assert handshakes == [False, True, True]
    assert kept.sock is None, "the old connection was not closed"
    api.close()


def session_tickets(address: str, ca: Path, request: bytes, *options: str) -> int:
    """How many TLS session tickets `openssl s_client` (given OPTIONS) receives from ADDRESS
    when it sends REQUEST (to which the listener answers and closes)."""
    done = subprocess.run(
        ["openssl", "s_client", "-connect", address, "-CAfile", str(ca), "-ign_eof", *options],
        input=request,
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert b"Verify return code: 0 (ok)" in done.stdout, done.stdout.decode(errors="replace")
    return done.stdout.count(b"Post-Handshake New Session Ticket arrived")


def test_the_api_gives_one_session_ticket_and_the_edge_none(
    cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    """The CLI resumes the last session it was given; node agents never resume, so the edge
    spends nothing on tickets."""
    start_server(cluster_files, SERVER)
    ca = Context.load(cluster_files.context_path).ca_path
    get = b"GET /healthz HTTP/1.0\r\n\r\n"
    # As the CLI does, by the name that gets the cluster-CA certificate.
    assert session_tickets(f"{SERVER}:8443", ca, get, "-servername", API_SERVER_NAME) == 1
    assert session_tickets(f"{SERVER}:7443", ca, get) == 0
