"""The management listener frees each finished connection at once (oz0/server/https.py):
hypercorn's server and protocol objects, the TLS stream and its socket point at each other,
a cycle that only the garbage collector freed, in pauses of 40-100 ms inside bursts of
requests. An in-process listener on 127.0.0.229, real TLS, Python's own HTTPS client."""

from __future__ import annotations

import gc
import http.client
import ssl

import trio
from hypercorn.trio.tcp_server import TCPServer
from quart_trio import QuartTrio

from fixtures.memory_cluster import in_memory_cluster
from oz0.server.certificates import ServerCertificates
from oz0.server.https import serve_https

ADDRESS = "127.0.0.229"
PORT = 8443


def live_connections() -> tuple[int, int]:
    """hypercorn's connections, and TLS streams, alive now."""
    found = gc.get_objects()
    return (
        sum(isinstance(o, TCPServer) for o in found),
        sum(isinstance(o, trio.SSLStream) for o in found),
    )


def hello_status(client_ctx: ssl.SSLContext) -> int:
    connection = http.client.HTTPSConnection(ADDRESS, PORT, context=client_ctx, timeout=10)
    try:
        connection.request("GET", "/hello")
        answer = connection.getresponse()
        answer.read()
        return answer.status
    finally:
        connection.close()


async def test_a_finished_connection_is_freed_without_the_garbage_collector() -> None:
    cluster = in_memory_cluster()
    server_ctx = ServerCertificates(cluster, "server-1", sans=(ADDRESS,)).server_context(
        ssl.CERT_OPTIONAL, tickets=1
    )
    client_ctx = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    app = QuartTrio("garbage")

    @app.get("/hello")
    async def hello() -> str:
        return "hello"

    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(30):
            async with trio.open_nursery() as nursery:
                await nursery.start(serve_https, app, server_ctx, ADDRESS, PORT)
                servers, streams = live_connections()
                for _ in range(5):
                    assert await trio.to_thread.run_sync(hello_status, client_ctx) == 200
                # The server's side of the last one ends just after the client's; the
                # listener's loop holds the last stream it accepted until the next.
                left = (servers, streams + 1)
                with trio.move_on_after(5):
                    while live_connections() != left:  # noqa: ASYNC110 (no event for this)
                        await trio.sleep(0.05)
                assert live_connections() == left, "finished connections wait for the collector"
                nursery.cancel_scope.cancel()
    finally:
        gc.enable()
