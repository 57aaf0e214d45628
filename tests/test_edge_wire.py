"""The edge's websocket over TLS on its socket (oz0/server/edge/wire.py), against
trio-websocket's client (the node agent's) over a real socket pair and real TLS."""

from __future__ import annotations

import gc
import ssl
import threading
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio
from trio_websocket import (
    ConnectionClosed,
    ConnectionRejected,
    WebSocketConnection,
    wrap_client_stream,
)

from fixtures.memory_cluster import in_memory_cluster
from oz0.server.certificates import ServerCertificates
from oz0.server.edge.wire import Closed, Wire, text_frame, tls_handshake

PATHS = frozenset({"/control"})
LIMIT = 64 * 1024


def contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    cluster = in_memory_cluster()
    server = ServerCertificates(cluster, "server-1", sans=("edge.test",))
    client = ssl.create_default_context(cadata=cluster.ca_pem.decode())
    client.check_hostname = False
    return server.server_context(ssl.CERT_OPTIONAL, tickets=0), client


async def server_wire(tcp: trio.SocketStream, context: ssl.SSLContext) -> Wire:
    tls = await tls_handshake(tcp, context)
    return Wire(tcp, *tls, max_message_size=LIMIT)


@asynccontextmanager
async def accepted_wire(
    path: str = "/control",
) -> AsyncIterator[tuple[Wire, WebSocketConnection, trio.Nursery]]:
    """A Wire accepted at PATH, the client's websocket, and a nursery for the test."""
    server_ctx, client_ctx = contexts()
    left, right = trio.socket.socketpair()
    server_tcp, client_tcp = trio.SocketStream(left), trio.SocketStream(right)
    with trio.fail_after(20), left, right:
        async with trio.open_nursery() as nursery:
            accepted: list[str | None] = []

            async def serve(task_status: trio.TaskStatus[Wire]) -> None:
                wire = await server_wire(server_tcp, server_ctx)
                accepted.append(await wire.accept(PATHS))
                task_status.started(wire)

            serving = trio.Event()
            wires: list[Wire] = []

            async def start_serving() -> None:
                wires.append(await nursery.start(serve))
                serving.set()

            nursery.start_soon(start_serving)
            client = await wrap_client_stream(
                nursery, trio.SSLStream(client_tcp, client_ctx), "edge.test", path
            )
            await serving.wait()
            assert accepted == [path]
            yield wires[0], client, nursery
            nursery.cancel_scope.cancel()


async def test_messages_go_both_ways_whole_and_in_order() -> None:
    big = "x" * (LIMIT - 10)
    async with accepted_wire() as (wire, client, _):
        for text in ['{"type":"heartbeat"}', big, "é" * 300]:
            await client.send_message(text)
        await client.send_message(b"\x00\x01 bytes")
        assert await wire.get_message() == '{"type":"heartbeat"}'
        assert await wire.get_message() == big
        assert await wire.get_message() == "é" * 300
        assert await wire.get_message() == b"\x00\x01 bytes"
        assert wire.send_now("one") is True
        assert wire.send_frame_now(text_frame(big)) is True
        await wire.send_message("three")
        assert [await client.get_message() for _ in range(3)] == ["one", big, "three"]


async def test_a_message_over_the_limit_closes_with_1009() -> None:
    async with accepted_wire() as (wire, client, _):
        await client.send_message("y" * (LIMIT + 1))
        with pytest.raises(Closed) as closed:
            await wire.get_message()
        assert closed.value.code == 1009
        with pytest.raises(ConnectionClosed) as seen:
            await client.get_message()
        assert seen.value.reason is not None and seen.value.reason.code == 1009


async def test_the_peers_close_ends_reads_after_what_came_before_it() -> None:
    async with accepted_wire() as (wire, client, nursery):
        await client.send_message("last words")
        nursery.start_soon(client.aclose, 4000, "bye")
        assert await wire.get_message() == "last words"
        with pytest.raises(Closed) as closed:
            await wire.get_message()
        assert (closed.value.code, closed.value.reason) == (4000, "bye")
        with pytest.raises(Closed):
            wire.send_now("too late")


async def test_our_close_reaches_the_peer_with_its_code_while_another_task_reads() -> None:
    async with accepted_wire() as (wire, client, nursery):
        read: list[BaseException] = []

        async def reader() -> None:
            try:
                await wire.get_message()
            except Closed as e:
                read.append(e)

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(wire.aclose, 4403, "blocked")
        with pytest.raises(ConnectionClosed) as seen:
            await client.get_message()
        assert seen.value.reason is not None
        assert (seen.value.reason.code, seen.value.reason.reason) == (4403, "blocked")
        await trio.testing.wait_all_tasks_blocked()
        assert len(read) == 1 and wire.closed is not None


async def test_pings_are_answered() -> None:
    async with accepted_wire() as (wire, client, nursery):
        nursery.start_soon(wire.get_message)
        with trio.fail_after(5):
            await client.ping(b"are you there")


async def test_another_path_gets_404() -> None:
    with pytest.RaisesGroup(
        pytest.RaisesExc(ConnectionRejected, check=lambda e: e.status_code == 404)
    ):
        async with accepted_wire("/elsewhere"):
            pass


async def test_what_is_not_an_upgrade_gets_400_and_ends() -> None:
    server_ctx, client_ctx = contexts()
    left, right = trio.socket.socketpair()
    server_tcp = trio.SocketStream(left)
    client = trio.SSLStream(trio.SocketStream(right), client_ctx)
    with trio.fail_after(20), left, right:
        async with trio.open_nursery() as nursery:
            wires: list[Wire] = []

            async def serve() -> None:
                wires.append(await server_wire(server_tcp, server_ctx))

            nursery.start_soon(serve)
            await client.do_handshake()
        await client.send_all(b"GET /control HTTP/1.1\r\nHost: x\r\n\r\n")
        with pytest.raises(Closed) as closed:
            await wires[0].accept(PATHS)
        assert closed.value.code == 1002
        assert (await client.receive_some(100)).startswith(b"HTTP/1.1 4")


async def test_a_peer_that_does_not_read_fills_the_socket_then_drain_waits_until_aborted() -> None:
    async with accepted_wire() as (wire, _client, nursery):
        frame = text_frame("z" * 60_000)
        sends = 0
        while wire.send_frame_now(frame):
            sends += 1
            assert sends < 1000, "the socket never filled"
        # Later sends queue behind what waits, in order, and all need the drain.
        assert wire.send_now("queued") is False
        ended: list[Closed] = []

        async def drain() -> None:
            try:
                await wire.drain()
            except Closed as e:
                ended.append(e)

        nursery.start_soon(drain)
        await trio.testing.wait_all_tasks_blocked()
        assert ended == []
        wire.abort()
        await trio.testing.wait_all_tasks_blocked()
        assert len(ended) == 1
        with pytest.raises(Closed):
            wire.send_now("after the abort")


async def handshake_thread(threads: trio.CapacityLimiter | None) -> int:
    """The thread that read the client's hello in a handshake with THREADS (the server's
    SNI callback runs in the step that does)."""
    server_ctx, client_ctx = contexts()
    ran_in: list[int] = []
    server_ctx.sni_callback = lambda *_: ran_in.append(threading.get_ident())
    left, right = trio.socket.socketpair()
    client = trio.SSLStream(trio.SocketStream(right), client_ctx, server_hostname="edge.test")
    with trio.fail_after(20), left, right:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.do_handshake)
            await tls_handshake(trio.SocketStream(left), server_ctx, threads=threads)
    assert len(ran_in) == 1
    return ran_in[0]


async def test_with_threads_the_handshakes_cryptography_runs_off_the_trio_thread() -> None:
    assert await handshake_thread(None) == threading.get_ident()
    assert await handshake_thread(trio.CapacityLimiter(1)) != threading.get_ident()


async def test_a_handshake_in_threads_leaves_no_cycle_for_the_garbage_collector() -> None:
    # A wait for the peer raised in a worker thread came back with a traceback through
    # the thread's frames, holding the handshake's objects in a cycle.
    server_ctx, client_ctx = contexts()
    left, right = trio.socket.socketpair()
    client = trio.SSLStream(trio.SocketStream(right), client_ctx, server_hostname="edge.test")
    gc.collect()
    gc.disable()
    try:
        with trio.fail_after(20), left, right:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(client.do_handshake)
                tls, _, _ = await tls_handshake(
                    trio.SocketStream(left), server_ctx, threads=trio.CapacityLimiter(2)
                )
        done = weakref.ref(tls)
        del tls, _
        assert done() is None, "the handshake's SSLObject waits for the garbage collector"
    finally:
        gc.enable()


async def test_the_end_kept_by_a_wire_is_never_raised_itself() -> None:
    # Raised, it would carry a traceback through the Wire's own frames: a cycle.
    async with accepted_wire() as (wire, client, nursery):
        nursery.start_soon(client.aclose, 4000, "bye")
        for _ in range(2):
            with pytest.raises(Closed) as raised:
                await wire.get_message()
            assert (raised.value.code, raised.value.reason) == (4000, "bye")
        with pytest.raises(Closed):
            wire.send_now("too late")
        assert wire.closed is not None and wire.closed is not raised.value
        assert wire.closed.__traceback__ is None
