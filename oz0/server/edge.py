"""The edge role on 7443: joins and control streams of nodes (docs/node-protocol.md).

TLS with a certificate from the cluster CA. Joining nodes have no certificate yet and
nodes with one open control streams on the same port, so client certificates are
optional at the handshake and required by `/control`.
"""

from __future__ import annotations

import json
import logging
import secrets
import ssl
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import psycopg
import trio
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from trio_websocket import (
    ConnectionClosed,
    WebSocketConnection,
    WebSocketRequest,
    wrap_server_stream,
)

from oz0 import audit, nodes, pki, tokens
from oz0.cluster import Cluster
from oz0.server import membership
from oz0.server.events import EventHub
from oz0.server.tls import open_tls_listeners
from oz0.store.pool import Database

log = logging.getLogger(__name__)

EDGE_PORT = 7443
HANDSHAKE_TIMEOUT = 10.0
FIRST_MESSAGE_TIMEOUT = 30.0
PICKUP_HOLD = 30.0
DIRECTORY_EVERY = 2.0
CLOSE_BLOCKED = 4403


def edge_address(advertise: str) -> str:
    host = f"[{advertise}]" if ":" in advertise else advertise
    return f"{host}:{EDGE_PORT}"


@dataclass
class EdgeDirectory:
    """The edges of the servers that are up, and an event for each change of them."""

    db: Database
    edges: list[str] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def refresh(self) -> None:
        servers = await self.db.transaction(membership.servers_up)
        edges = sorted(edge_address(s.advertise) for s in servers)
        if edges != self.edges:
            self.edges = edges
            self.changed.set()
            self.changed = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.refresh()
        task_status.started()
        while True:
            await trio.sleep(DIRECTORY_EVERY)
            try:
                await self.refresh()
            except psycopg.Error as e:
                log.warning("could not read the servers that are up: %s", e)


@dataclass
class SeenTracker:
    """Batches what streams tell about their nodes into one transaction per heartbeat
    interval: who was heard from (alive here) and whose stream ended (gone from here)."""

    db: Database
    server_id: str
    pending: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)

    def alive(self, node_id: str) -> None:
        self.pending.add(node_id)
        self.gone.discard(node_id)

    def left(self, node_id: str) -> None:
        # A heartbeat heard just before the stream ended must not mark it connected again.
        self.pending.discard(node_id)
        self.gone.add(node_id)

    async def flush(self) -> None:
        if not self.pending and not self.gone:
            return
        seen, self.pending = sorted(self.pending), set()
        gone, self.gone = sorted(self.gone), set()

        def write(conn: psycopg.Connection[Any]) -> None:
            if gone:
                nodes.disconnected(conn, gone, self.server_id)
            if seen:
                nodes.seen(conn, seen, self.server_id)

        try:
            await self.db.transaction(write)
        except psycopg.Error as e:
            log.warning("could not record %d nodes seen, %d gone: %s", len(seen), len(gone), e)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        try:
            while True:
                await trio.sleep(nodes.HEARTBEAT)
                await self.flush()
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                await self.flush()


@dataclass
class Edge:
    db: Database
    cluster: Cluster
    server_id: str
    hub: EventHub
    directory: EdgeDirectory
    seen: SeenTracker
    streams: int = 0

    @property
    def actor(self) -> audit.Actor:
        return audit.Actor("server", self.server_id)


async def run(
    db: Database,
    cluster: Cluster,
    server_id: str,
    hub: EventHub,
    tls_context: ssl.SSLContext,
    host: str,
    port: int = EDGE_PORT,
    *,
    task_status: trio.TaskStatus[Edge] = trio.TASK_STATUS_IGNORED,
) -> None:
    edge = Edge(db, cluster, server_id, hub, EdgeDirectory(db), SeenTracker(db, server_id))
    listeners = await open_tls_listeners(port, tls_context, host)
    async with trio.open_nursery() as nursery:
        await nursery.start(edge.directory.run)
        await nursery.start(edge.seen.run)
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
            await _send(
                ws,
                "hello",
                cluster=edge.cluster.name,
                ca_hash=edge.cluster.ca_hash,
                ca_pem=edge.cluster.ca_pem.decode(),
                challenge=challenge.hex(),
            )
            if request.path == "/join":
                await _join(edge, ws, challenge)
            else:
                await _control(edge, ws, peer_der)
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


async def _send(ws: WebSocketConnection, kind: str, **fields: Any) -> None:
    await ws.send_message(json.dumps({"type": kind, **fields}))


async def _receive(ws: WebSocketConnection) -> dict[str, Any]:
    with trio.fail_after(FIRST_MESSAGE_TIMEOUT):
        raw = await ws.get_message()
    try:
        message = json.loads(raw)
    except ValueError:
        message = None
    if not isinstance(message, dict):
        raise ValueError("messages must be JSON objects")
    return message


# --- joining ---------------------------------------------------------------------------


async def _join(edge: Edge, ws: WebSocketConnection, challenge: bytes) -> None:
    try:
        message = await _receive(ws)
    except ValueError as e:
        await _send(ws, "error", code="bad_request", message=str(e))
        return
    if message.get("type") == "join":
        await _answer_join(edge, ws, message)
    elif message.get("type") == "pickup":
        await _answer_pickup(edge, ws, message, challenge)
    else:
        await _send(ws, "error", code="bad_request", message="expected a join or pickup message")


async def _answer_join(edge: Edge, ws: WebSocketConnection, message: dict[str, Any]) -> None:
    csr, token = message.get("csr"), message.get("token")
    labels, hostname = message.get("labels") or {}, message.get("hostname") or ""
    if not isinstance(csr, str) or not (token is None or isinstance(token, str)):
        await _send(ws, "error", code="bad_request", message="join needs a PEM csr")
        return
    hostname = hostname if isinstance(hostname, str) else ""

    def add(conn: psycopg.Connection[Any]) -> nodes.Joined:
        again = nodes.rejoin(conn, csr)
        if again is not None:
            return again
        if token:
            used = tokens.consume(conn, token)
            return nodes.join(
                conn,
                edge.cluster.cluster_ca,
                csr_pem=csr,
                labels=labels,
                hostname=hostname,
                token_id=used.id,
                token_tenant=used.tenant,
                token_labels=used.labels,
            )
        return nodes.join(
            conn, edge.cluster.cluster_ca, csr_pem=csr, labels=labels, hostname=hostname
        )

    try:
        joined = await edge.db.transaction(add)
    except tokens.TokenRefused as e:
        refusal = e
        await edge.db.transaction(
            partial(tokens.record_refusal, refusal=refusal, hostname=hostname, actor=edge.actor)
        )
        await _send(ws, "error", code="token_refused", message=str(refusal))
        return
    except nodes.NodeError as e:
        await _send(ws, "error", code="bad_request", message=str(e))
        return
    log.info("node %s joined (%s, tenant %s)", joined.node_id, joined.state, joined.tenant)
    await _send(
        ws,
        "joined",
        node_id=joined.node_id,
        state=joined.state,
        tenant=joined.tenant,
        certificate=joined.certificate,
        edges=edge.directory.edges,
    )


async def _answer_pickup(
    edge: Edge, ws: WebSocketConnection, message: dict[str, Any], challenge: bytes
) -> None:
    node_id, signature = message.get("node_id"), message.get("signature")
    if not isinstance(node_id, str) or not isinstance(signature, str):
        await _send(ws, "error", code="bad_request", message="pickup needs node_id and signature")
        return
    with trio.move_on_after(PICKUP_HOLD):
        while True:
            with edge.hub.watch_node(node_id) as changed:
                try:
                    found = await edge.db.transaction(
                        lambda conn: nodes.pickup(conn, node_id, challenge, signature)
                    )
                except nodes.NodeNotFound:
                    await _send(
                        ws, "error", code="unknown_node", message=f"node {node_id} not found"
                    )
                    return
                if found.state == "accepted" and found.certificate:
                    await _send(
                        ws,
                        "joined",
                        node_id=node_id,
                        state="accepted",
                        tenant=found.tenant,
                        certificate=found.certificate,
                        edges=edge.directory.edges,
                    )
                    return
                if found.state == "rejected":
                    await _send(ws, "rejected", reason=found.reason or "rejected by an operator")
                    return
                if found.state != "pending":
                    await _send(
                        ws, "error", code=found.state, message=f"node {node_id} is {found.state}"
                    )
                    return
                await changed.wait()
    await _send(ws, "pending")


# --- control streams -------------------------------------------------------------------


async def _control(edge: Edge, ws: WebSocketConnection, peer_der: bytes | None) -> None:
    node_id, key = _node_of(peer_der, edge.cluster.name)
    if node_id is None or key is None:
        await _send(
            ws, "refused", code="unknown", message="a node certificate of this cluster is required"
        )
        return
    with edge.hub.watch_node(node_id) as changed:
        state = await edge.db.transaction(lambda conn: nodes.control_state(conn, node_id, key))
        if state != "accepted":
            code = state or "unknown"
            await _send(ws, "refused", code=code, message=f"node {node_id} is {code}")
            return
        edge.seen.alive(node_id)
        await edge.db.transaction(lambda conn: nodes.connected(conn, node_id, edge.server_id))
        edge.streams += 1
        try:
            await _send(
                ws,
                "welcome",
                node_id=node_id,
                server=edge.server_id,
                heartbeat=nodes.HEARTBEAT,
                edges=edge.directory.edges,
            )
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_heartbeats_and_edges, edge, ws)
                nursery.start_soon(_receive_heartbeats, edge, ws, node_id, nursery.cancel_scope)
                nursery.start_soon(
                    _end_when_not_accepted, edge, ws, node_id, key, changed, nursery.cancel_scope
                )
        finally:
            edge.streams -= 1
            edge.seen.left(node_id)


def _node_of(
    peer_der: bytes | None, cluster: str
) -> tuple[str | None, ec.EllipticCurvePublicKey | None]:
    if peer_der is None:
        return None, None
    cert = x509.load_der_x509_certificate(peer_der)
    identity = pki.identity_of(cert)
    key = cert.public_key()
    if identity.role != pki.Role.NODE or identity.cluster != cluster:
        return None, None
    if not isinstance(key, ec.EllipticCurvePublicKey):
        return None, None
    return identity.name, key


async def _heartbeats_and_edges(edge: Edge, ws: WebSocketConnection) -> None:
    known = list(edge.directory.edges)
    while True:
        with trio.move_on_after(nodes.HEARTBEAT):
            await edge.directory.changed.wait()
        if edge.directory.edges != known:
            known = list(edge.directory.edges)
            await _send(ws, "edges", edges=known)
        else:
            await _send(ws, "heartbeat")


async def _receive_heartbeats(
    edge: Edge, ws: WebSocketConnection, node_id: str, scope: trio.CancelScope
) -> None:
    """Anything from the node is a sign of life; silence for three heartbeats ends it."""
    try:
        while True:
            with trio.fail_after(3 * nodes.HEARTBEAT):
                await ws.get_message()
            edge.seen.alive(node_id)
    except trio.TooSlowError:
        log.info("node %s silent for three heartbeats; closing its stream", node_id)
    except ConnectionClosed:
        pass
    scope.cancel()


async def _end_when_not_accepted(
    edge: Edge,
    ws: WebSocketConnection,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    changed: trio.Event,
    scope: trio.CancelScope,
) -> None:
    await changed.wait()
    while True:
        with edge.hub.watch_node(node_id) as next_change:
            state = await edge.db.transaction(lambda conn: nodes.control_state(conn, node_id, key))
            if state != "accepted":
                code = state or "unknown"
                await _send(ws, "refused", code=code, message=f"node {node_id} is {code}")
                await ws.aclose(CLOSE_BLOCKED, code)
                scope.cancel()
                return
            await next_change.wait()
