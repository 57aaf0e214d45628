"""TLS on the management listener (oz0/server/tls_stream.py, oz0/server/https.py): the
stream hypercorn reads and writes, against trio.SSLStream's client over a real socket pair,
and the whole listener on 127.0.0.229 against a client with an operator's certificate."""

from __future__ import annotations

import datetime as dt
import os
import socket
import ssl
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from cryptography.hazmat.primitives import serialization

from oz0 import pki
from oz0.server.certificates import ServerCertificates
from oz0.server.https import peer_cert_der, serve_https
from oz0.server.tls_stream import TlsStream, tls_handshake
from oz0_common.certs import new_private_key
from tests.test_certificates import in_memory_cluster

ADDRESS = "127.0.0.229"
PORT = 8443


def contexts(client_chain: Path | None = None) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's context, and a client's (with an operator's certificate written to
    CLIENT_CHAIN and loaded, if given)."""
    cluster = in_memory_cluster()
    server = ServerCertificates(cluster, "server-1", sans=(ADDRESS,))
    client = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    client.check_hostname = False
    if client_chain is not None:
        key = new_private_key()
        cert = cluster.cluster_ca.issue(
            key.public_key(), name="ada", role=pki.Role.OPERATOR, validity=dt.timedelta(days=1)
        )
        with open(client_chain, "wb", opener=lambda p, f: os.open(p, f, 0o600)) as f:
            f.write(cert.public_bytes(serialization.Encoding.PEM))
            f.write(
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                )
            )
        client.load_cert_chain(client_chain)
    return server.server_context(ssl.CERT_OPTIONAL), client


@asynccontextmanager
async def pair(
    *, https_compatible: bool = False
) -> AsyncIterator[tuple[TlsStream, trio.SSLStream[trio.SocketStream]]]:
    """A TlsStream and trio.SSLStream's client on a socket pair, handshaken."""
    server_ctx, client_ctx = contexts()
    left, right = trio.socket.socketpair()
    server_tcp = trio.SocketStream(left)
    client = trio.SSLStream(
        trio.SocketStream(right), client_ctx, server_hostname="x", https_compatible=https_compatible
    )
    with trio.fail_after(20), left, right:
        streams: list[TlsStream] = []

        async def serve() -> None:
            streams.append(TlsStream(server_tcp, *await tls_handshake(server_tcp, server_ctx)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve)
            await client.do_handshake()
        yield streams[0], client


async def receive_exactly(stream: trio.abc.ReceiveStream, size: int) -> bytes:
    got = bytearray()
    while len(got) < size:
        chunk = await stream.receive_some()
        assert chunk, f"the stream ended after {len(got)} of {size} bytes"
        got += chunk
    return bytes(got)


async def test_a_megabyte_each_way_arrives_whole_and_in_order() -> None:
    sent = bytes(range(256)) * 4096
    async with pair() as (server, client), trio.open_nursery() as nursery:
        # Both directions at once: neither side reads until it has written, so the
        # sockets' buffers fill and each write waits for the other's reads.
        nursery.start_soon(server.send_all, sent)
        nursery.start_soon(client.send_all, sent[::-1])
        assert await receive_exactly(client, len(sent)) == sent
        assert await receive_exactly(server, len(sent)) == sent[::-1]


async def test_a_peer_that_closes_without_close_notify_reads_as_the_end() -> None:
    async with pair() as (server, client):
        await client.send_all(b"last words")
        client.transport_stream.socket.shutdown(socket.SHUT_WR)  # no TLS close_notify
        assert await receive_exactly(server, 10) == b"last words"
        assert await server.receive_some() == b""


async def test_closing_sends_close_notify_and_later_calls_are_refused() -> None:
    async with pair() as (server, client):
        await server.aclose()
        # trio.SSLStream without https_compatible raises on an end without close_notify.
        assert await client.receive_some() == b""
        with pytest.raises(trio.ClosedResourceError):
            await server.send_all(b"x")
        with pytest.raises(trio.ClosedResourceError):
            await server.receive_some()
        await server.aclose()  # twice is fine


async def test_the_listener_handshakes_off_the_trio_thread_and_hands_the_certificate_on(
    tmp_path: Path,
) -> None:
    """A request through serve_https: the TLS handshake read the client's hello in a worker
    thread, and the app saw the client's certificate in its scope."""
    server_ctx, client_ctx = contexts(tmp_path / "operator.pem")
    hello_read_in: list[int] = []
    server_ctx.sni_callback = lambda *_: hello_read_in.append(threading.get_ident())
    seen: list[bytes | None] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        seen.append(peer_cert_der(scope))
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]}
        )
        await send({"type": "http.response.body", "body": b"hello"})

    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_https, app, server_ctx, ADDRESS, PORT)
            tcp = await trio.open_tcp_stream(ADDRESS, PORT)
            client = trio.SSLStream(tcp, client_ctx, server_hostname=ADDRESS)
            await client.send_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := await client.receive_some():
                answer += chunk
            await trio.aclose_forcefully(client)
            nursery.cancel_scope.cancel()
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    assert hello_read_in and hello_read_in[0] != threading.get_ident()
    assert len(seen) == 1 and seen[0] is not None
    assert pki.identity_of_der(seen[0]).name == "ada"
