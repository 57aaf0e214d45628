"""An answer given before its request's body came in (a 413 for a body over the limit) ends
only once the rest of the body is read, within bounds (oz0/server/lingering.py): closing at
once would reset the connection under a client still sending, which could then lose the
answer (curl's exit 55 instead of the 413). An in-process listener on 127.0.0.28, real TLS,
a client on a plain TLS socket that sends its body in two halves around reading the answer."""

from __future__ import annotations

import select
import socket
import ssl
import time
from collections.abc import Callable

import trio
from quart import request
from quart_trio import QuartTrio

from fixtures.memory_cluster import in_memory_cluster
from oz0.server.certificates import ServerCertificates
from oz0.server.https import serve_https
from oz0.server.lingering import LINGER_TIME

ADDRESS = "127.0.0.28"
PORT = 8443
LIMIT = 64 * 1024
BODY = 1024 * 1024
FIRST = 32 * 1024


def app_with_a_limit() -> QuartTrio:
    app = QuartTrio("lingering")
    app.config["MAX_CONTENT_LENGTH"] = LIMIT

    @app.post("/upload")
    async def upload() -> str:
        await request.get_data()  # over the limit: Quart answers 413 from here
        return "taken"

    return app


def read_answer(tls: ssl.SSLSocket) -> bytes:
    """The whole answer: headers, and the body its Content-Length gives."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += tls.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += tls.recv(65536)
    return head.split(b"\r\n", 1)[0] + b"\r\n" + body


def closed_within(tls: ssl.SSLSocket, seconds: float) -> bool:
    """Whether the server ends the connection within SECONDS (its close_notify, its FIN or a
    reset); the answer has been read whole, so anything readable now is the end."""
    if tls.pending() or select.select([tls], [], [], seconds)[0]:
        try:
            return tls.recv(1) == b""
        except (ssl.SSLError, OSError):
            return True
    return False


def post(tls: ssl.SSLSocket, length: int, sent: int) -> None:
    """A POST of a LENGTH-byte body, of which the first SENT bytes go now."""
    tls.sendall(
        f"POST /upload HTTP/1.1\r\nHost: {ADDRESS}\r\nContent-Length: {length}\r\n"
        "Content-Type: application/octet-stream\r\n\r\n".encode()
        + b"x" * sent
    )


def tls_connected(client_ctx: ssl.SSLContext) -> ssl.SSLSocket:
    raw = socket.create_connection((ADDRESS, PORT), timeout=10)
    return client_ctx.wrap_socket(raw, server_hostname=ADDRESS)


async def on_a_listener(test: Callable[[ssl.SSLContext], None]) -> None:
    cluster = in_memory_cluster()
    server_ctx = ServerCertificates(cluster, "server-1", sans=(ADDRESS,)).server_context(
        ssl.CERT_OPTIONAL, tickets=1
    )
    client_ctx = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            await nursery.start(serve_https, app_with_a_limit(), server_ctx, ADDRESS, PORT)
            await trio.to_thread.run_sync(test, client_ctx)
            nursery.cancel_scope.cancel()


async def test_an_answer_before_the_body_waits_for_the_rest_and_the_connection_goes_on() -> None:
    def test(client_ctx: ssl.SSLContext) -> None:
        with tls_connected(client_ctx) as tls:
            post(tls, BODY, FIRST)
            answer = read_answer(tls)
            assert answer.startswith(b"HTTP/1.1 413 "), answer
            assert not closed_within(tls, 0.5), "closed under a client still sending its body"
            tls.sendall(b"x" * (BODY - FIRST))
            # The whole body read, the exchange ended cleanly: the next request is answered.
            post(tls, 5, 5)
            answer = read_answer(tls)
            assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"taken"), answer

    await on_a_listener(test)


async def test_a_client_that_never_sends_the_rest_is_closed_after_the_bound() -> None:
    def test(client_ctx: ssl.SSLContext) -> None:
        with tls_connected(client_ctx) as tls:
            post(tls, BODY, FIRST)
            answer = read_answer(tls)
            began = time.monotonic()
            assert answer.startswith(b"HTTP/1.1 413 "), answer
            assert closed_within(tls, LINGER_TIME + 2), "held open past the bound"
            assert time.monotonic() - began > LINGER_TIME - 0.3, "closed before the bound"

    await on_a_listener(test)
