"""The edge's listener: TLS, the websocket upgrade and the greeting, per connection (wire.py)."""

from __future__ import annotations

import logging
import secrets
import ssl
from collections.abc import Callable
from functools import partial

import trio

from oz0 import audit, nodes
from oz0.cluster import Cluster
from oz0.server import accept_bursts
from oz0.server.admission import Admission, peer_address
from oz0.server.edge.common import (
    FIRST_MESSAGE_TIMEOUT,
    MAX_MESSAGE_SIZE,
    DatabaseUnavailable,
    Edge,
    close,
    send,
)
from oz0.server.edge.control import serve_control
from oz0.server.edge.directory import EDGE_PORT, EdgeDirectory, edge_address, frontend_address
from oz0.server.edge.handshake_turns import HandshakeStream, Turns
from oz0.server.edge.join import PICKUP_HOLD, serve_join
from oz0.server.edge.join_refusals import JoinRefusals
from oz0.server.edge.metrics import EdgeMetrics
from oz0.server.edge.tracking import RECONCILE_EVERY, SeenTracker, StreamReconciler
from oz0.server.edge.wire import Closed, Wire, tls_handshake
from oz0.server.session_relay import SessionRelay
from oz0.server.tls import open_tcp_listeners
from oz0.store.events import EventHub
from oz0.store.pool import Database
from oz0.temporal.namespaces import InNamespace

log = logging.getLogger(__name__)

# TLS, then the websocket upgrade: each within this.
HANDSHAKE_TIMEOUT = 10.0
EDGE_QUERIES = 4
# Sending to a peer that does not read (the greeting, a refusal) gives up after this.
SEND_TIMEOUT = 10.0
# A whole /join conversation: the first message, a pickup held open, the answer.
JOIN_TIMEOUT = FIRST_MESSAGE_TIMEOUT + PICKUP_HOLD + SEND_TIMEOUT


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
    max_pending: int = nodes.MAX_PENDING,
    metrics: EdgeMetrics | None = None,
    in_namespace: InNamespace | None = None,
    sessions: SessionRelay | None = None,
    task_status: trio.TaskStatus[Edge] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Thousands of nodes reconnecting at once (a server lost) query the database once
    # each; they get half the pool, so operators' requests, the re-reads that end blocked
    # nodes' streams and the rest of the server do not queue behind them.
    pool, db = db, db.sharing(EDGE_QUERIES)
    edge = Edge(
        db,
        cluster,
        server_id,
        hub,
        EdgeDirectory(db, edge_address(advertise) if advertise else None),
        SeenTracker(db, server_id),
        StreamReconciler(db, hub, reconcile_every),
        JoinRefusals(db, audit.Actor("server", server_id)),
        temporal=frontend_address(advertise) if advertise else None,
        max_pending=max_pending,
        metrics=metrics or EdgeMetrics(),
        prompt_db=pool,
        in_namespace=in_namespace,
        sessions=sessions or SessionRelay(),
    )
    admission = Admission(f"edge {host}:{port}", on_refused=edge.metrics.connection_over_limit)
    turns = Turns(f"edge {host}:{port}", on_busy=edge.metrics.connection_shed)
    listeners = await open_tcp_listeners(port, host)
    async with trio.open_nursery() as nursery:
        await nursery.start(edge.directory.run)
        await nursery.start(edge.seen.run)
        await nursery.start(edge.streams.run)
        await nursery.start(edge.heartbeats.run)
        await nursery.start(edge.join_refusals.run)
        await nursery.start(edge.attempt_refusals.run)
        await nursery.start(edge.part_ends.run)
        await nursery.start(edge.output_writes.serve)
        await nursery.start(edge.waiting_reads.serve)
        await nursery.start(edge.joins.run)
        await nursery.start(edge.state_reads.serve)
        admit = partial(_admit, edge, admission, tls_context, turns)
        # Connections outlive the accepting: a drain (`edge.leaving`) closes the listeners
        # first, then waits for the streams to end.
        async with trio.open_nursery() as connections:
            await connections.start(_accept_until_leaving, edge, admit, listeners, connections)
            task_status.started(edge)


async def drain(edge: Edge) -> None:
    """Accept no more connections, tell every streamed node to move to another server
    (control.serve_control) and return once their streams have ended. Unbounded: the
    caller bounds it, and a /join conversation under way is left to it."""
    edge.leaving.set()
    await edge.streams.wait_all_closed()


async def _accept_until_leaving(
    edge: Edge,
    admit: accept_bursts.Handler,
    listeners: list[trio.SocketListener],
    connections: trio.Nursery,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with trio.open_nursery() as accepting:
        await accepting.start(
            partial(accept_bursts.serve, admit, listeners, handler_nursery=connections)
        )
        task_status.started()
        await edge.leaving.wait()
        # Closes the listeners: a node connecting from now on is refused at once.
        accepting.cancel_scope.cancel()


async def _admit(
    edge: Edge,
    admission: Admission,
    tls_context: ssl.SSLContext,
    turns: Turns,
    tcp: trio.SocketStream,
) -> None:
    slot = admission.admit(peer_address(tcp))
    if slot is None:
        await trio.aclose_forcefully(tcp)
        return
    transport = HandshakeStream(tcp, turns)
    try:
        await _handle(edge, transport, tls_context, slot.release)
    finally:
        transport.handshake_done()
        slot.release()


async def _handle(
    edge: Edge,
    transport: HandshakeStream,
    tls_context: ssl.SSLContext,
    authenticated: Callable[[], None],
) -> None:
    """One connection; AUTHENTICATED is called once it has proven who it is."""
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            tls = await tls_handshake(transport, tls_context, threads=edge.handshake_threads)
        transport.handshake_done()
        ws = Wire(transport.inner, *tls, max_message_size=MAX_MESSAGE_SIZE)
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            path = await ws.accept(PATHS)
        if path is None:
            return
        peer_der = ws.peer_certificate()
        challenge = secrets.token_bytes(32)
        with trio.fail_after(SEND_TIMEOUT):
            await send(
                ws,
                "hello",
                cluster=edge.cluster.name,
                ca_hash=edge.cluster.ca_hash,
                ca_pem=edge.cluster.ca_pem.decode(),
                challenge=challenge.hex(),
            )
        try:
            if path == "/join":
                with trio.fail_after(JOIN_TIMEOUT):
                    await serve_join(edge, ws, challenge)
            elif peer_der is None:
                with trio.fail_after(SEND_TIMEOUT):
                    await serve_control(edge, ws, peer_der, challenge)
            else:
                # TLS verified a certificate of the cluster CA: no longer a stranger.
                authenticated()
                await serve_control(edge, ws, peer_der, challenge)
        except DatabaseUnavailable as e:
            kind = "error" if path == "/join" else "refused"
            with trio.fail_after(SEND_TIMEOUT):
                await send(ws, kind, code=e.code, message=e.message)
        await close(ws)
    except* _CONNECTION_ENDED as group:
        log.debug("edge connection ended: %r", group.exceptions[0])
    except* Exception as group:
        # One node's connection must never take the edge down with it.
        log.error("edge connection failed", exc_info=group)
    finally:
        await trio.aclose_forcefully(transport)


PATHS = frozenset({"/join", "/control"})
_CONNECTION_ENDED = (
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    trio.TooSlowError,
    Closed,
    ssl.SSLError,
)
