"""The edge's listener: TLS, the websocket upgrade and the greeting, per connection."""

from __future__ import annotations

import logging
import secrets
import ssl
from functools import partial

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, wrap_server_stream

from oz0.cluster import Cluster
from oz0.server.edge.common import DatabaseUnavailable, Edge, send
from oz0.server.edge.control import serve_control
from oz0.server.edge.directory import EDGE_PORT, EdgeDirectory, edge_address, frontend_address
from oz0.server.edge.join import serve_join
from oz0.server.edge.tracking import RECONCILE_EVERY, SeenTracker, StreamReconciler
from oz0.server.events import EventHub
from oz0.server.tls import open_tls_listeners
from oz0.store.pool import Database

log = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT = 10.0


async def run(
    db: Database,
    cluster: Cluster,
    server_id: str,
    hub: EventHub,
    tls_context: ssl.SSLContext,
    host: str,
    port: int = EDGE_PORT,
    *,
    advertise: str | None = None,
    reconcile_every: float = RECONCILE_EVERY,
    task_status: trio.TaskStatus[Edge] = trio.TASK_STATUS_IGNORED,
) -> None:
    edge = Edge(
        db,
        cluster,
        server_id,
        hub,
        EdgeDirectory(db, edge_address(advertise) if advertise else None),
        SeenTracker(db, server_id),
        StreamReconciler(db, hub, reconcile_every),
        temporal=frontend_address(advertise) if advertise else None,
    )
    listeners = await open_tls_listeners(port, tls_context, host)
    async with trio.open_nursery() as nursery:
        await nursery.start(edge.directory.run)
        await nursery.start(edge.seen.run)
        await nursery.start(edge.streams.run)
        await nursery.start(partial(trio.serve_listeners, partial(_handle, edge), listeners))
        task_status.started(edge)


async def _handle(edge: Edge, stream: trio.SSLStream[trio.SocketStream]) -> None:
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await stream.do_handshake()
        peer_der = stream.getpeercert(binary_form=True)
        async with trio.open_nursery() as nursery:
            request: WebSocketRequest = await wrap_server_stream(nursery, stream)
            if request.path not in ("/join", "/control"):
                await request.reject(404)
                return
            ws = await request.accept()
            challenge = secrets.token_bytes(32)
            await send(
                ws,
                "hello",
                cluster=edge.cluster.name,
                ca_hash=edge.cluster.ca_hash,
                ca_pem=edge.cluster.ca_pem.decode(),
                challenge=challenge.hex(),
            )
            try:
                if request.path == "/join":
                    await serve_join(edge, ws, challenge)
                else:
                    await serve_control(edge, ws, peer_der, challenge)
            except DatabaseUnavailable as e:
                kind = "error" if request.path == "/join" else "refused"
                await send(ws, kind, code=e.code, message=e.message)
            await ws.aclose()
    except* _CONNECTION_ENDED as group:
        log.debug("edge connection ended: %r", group.exceptions[0])
    except* Exception as group:
        # One node's connection must never take the edge down with it.
        log.error("edge connection failed", exc_info=group)
    finally:
        await trio.aclose_forcefully(stream)


_CONNECTION_ENDED = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    ConnectionClosed,
    ssl.SSLError,
)
