"""The edge role on 7443: joins and control streams of nodes (docs/node-protocol.md).

TLS with a certificate from the cluster CA. Joining nodes have no certificate yet and
nodes with one open control streams on the same port, so client certificates are
optional at the handshake and required by `/control`.
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import secrets
import ssl
from collections.abc import Awaitable, Callable
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

from oz0 import audit, nodes, pki, purge_command, tokens
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
RECONCILE_EVERY = 1.0
PURGE_ANSWER_TIMEOUT = 30.0
CLOSE_BLOCKED = 4403


def edge_address(advertise: str) -> str:
    host = f"[{advertise}]" if ":" in advertise else advertise
    return f"{host}:{EDGE_PORT}"


def next_edges(current: list[str], up: set[str], lingering: set[str], own: str | None) -> list[str]:
    """The edges to tell nodes about, with hysteresis so one late heartbeat is no news.

    A server comes in when its heartbeat is fresh (UP), leaves only once it has been
    silent for twice that (not LINGERING any more) or has removed its row; this server
    always lists itself, since it is obviously up when it answers.
    """
    edges = up | (set(current) & lingering)
    if own is not None:
        edges.add(own)
    return sorted(edges)


@dataclass
class EdgeDirectory:
    """The edges of the servers that are up, and an event for each change of them."""

    db: Database
    own: str | None = None
    edges: list[str] = field(default_factory=list)
    changed: trio.Event = field(default_factory=trio.Event)

    async def refresh(self) -> None:
        def read(conn: psycopg.Connection[Any]) -> tuple[set[str], set[str]]:
            up = membership.servers_up(conn)
            lingering = membership.servers_up(conn, 2 * membership.UP_WINDOW)
            return (
                {edge_address(s.advertise) for s in up},
                {edge_address(s.advertise) for s in lingering},
            )

        up, lingering = await self.db.transaction(read)
        edges = next_edges(self.edges, up, lingering, self.own)
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
    streams: StreamReconciler

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
    advertise: str | None = None,
    task_status: trio.TaskStatus[Edge] = trio.TASK_STATUS_IGNORED,
) -> None:
    edge = Edge(
        db,
        cluster,
        server_id,
        hub,
        EdgeDirectory(db, edge_address(advertise) if advertise else None),
        SeenTracker(db, server_id),
        StreamReconciler(db, hub),
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
                await _control(edge, ws, peer_der, challenge)
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


async def _control(
    edge: Edge, ws: WebSocketConnection, peer_der: bytes | None, challenge: bytes
) -> None:
    node_id, key = _node_of(peer_der, edge.cluster.name)
    if node_id is None or key is None:
        await _send(
            ws, "refused", code="unknown", message="a node certificate of this cluster is required"
        )
        return
    with edge.hub.watch_node(node_id) as changed:
        state = await edge.db.transaction(lambda conn: nodes.control_state(conn, node_id, key))
        if state == "purging":
            await _purge(
                edge, ws, node_id, key, challenge, partial(_next_answer, edge, ws, node_id)
            )
            return
        if state != "accepted":
            await _refuse(ws, node_id, state)
            return
        edge.seen.alive(node_id)
        await edge.db.transaction(lambda conn: nodes.connected(conn, node_id, edge.server_id))
        edge.streams.opened(node_id)
        try:
            await _send(
                ws,
                "welcome",
                node_id=node_id,
                server=edge.server_id,
                heartbeat=nodes.HEARTBEAT,
                edges=edge.directory.edges,
            )
            answers_in, answers_out = trio.open_memory_channel[dict[str, Any]](4)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_heartbeats_and_edges, edge, ws)
                nursery.start_soon(
                    _receive_from_node, edge, ws, node_id, answers_in, nursery.cancel_scope
                )
                nursery.start_soon(
                    _act_on_changes,
                    edge,
                    ws,
                    node_id,
                    key,
                    changed,
                    partial(answers_out.receive),
                    challenge,
                    nursery.cancel_scope,
                )
        finally:
            edge.streams.closed(node_id)
            edge.seen.left(node_id)


async def _refuse(ws: WebSocketConnection, node_id: str, state: str | None) -> None:
    code = state or "unknown"
    await _send(ws, "refused", code=code, message=f"node {node_id} is {code}")


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


async def _receive_from_node(
    edge: Edge,
    ws: WebSocketConnection,
    node_id: str,
    answers: trio.MemorySendChannel[dict[str, Any]],
    scope: trio.CancelScope,
) -> None:
    """Anything from the node is a sign of life; silence for three heartbeats ends it.

    Answers to a purge command go to whoever sent it.
    """
    try:
        while True:
            with trio.fail_after(3 * nodes.HEARTBEAT):
                raw = await ws.get_message()
            edge.seen.alive(node_id)
            message = _decode(raw)
            if message.get("type") in _PURGE_ANSWERS:
                await _record_answer(edge, node_id, message)
                with contextlib.suppress(trio.WouldBlock):
                    answers.send_nowait(message)
    except trio.TooSlowError:
        log.info("node %s silent for three heartbeats; closing its stream", node_id)
    except ConnectionClosed:
        pass
    scope.cancel()


async def _act_on_changes(
    edge: Edge,
    ws: WebSocketConnection,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    changed: trio.Event,
    next_answer: Callable[[], Awaitable[dict[str, Any]]],
    challenge: bytes,
    scope: trio.CancelScope,
) -> None:
    """End the stream when the node stops being accepted, purging it first if it is purging.

    Woken by a notification about the node, or by the reconcile loop if one was lost.
    """
    await changed.wait()
    while True:
        with edge.hub.watch_node(node_id) as next_change:
            state = await edge.db.transaction(lambda conn: nodes.control_state(conn, node_id, key))
            if state != "accepted":
                break
            await next_change.wait()
    if state == "purging":
        await _purge(edge, ws, node_id, key, challenge, next_answer)
    else:
        log.info("node %s is %s now; ending its stream", node_id, state or "unknown")
        await _refuse(ws, node_id, state)
        await ws.aclose(CLOSE_BLOCKED, state or "unknown")
    scope.cancel()


# --- purging ---------------------------------------------------------------------------

_PURGE_ANSWERS = ("purged", "purge_refused")


def _decode(raw: str | bytes) -> dict[str, Any]:
    try:
        message = json.loads(raw)
    except ValueError:
        return {}
    return message if isinstance(message, dict) else {}


async def _record_answer(edge: Edge, node_id: str, message: dict[str, Any]) -> None:
    """A refused purge command is recorded whoever sent it: it may not have been us."""
    if message.get("type") != "purge_refused":
        return
    reason, nonce = message.get("reason"), message.get("nonce")
    reason = reason if isinstance(reason, str) else "no reason given"
    nonce = nonce if isinstance(nonce, str) else None
    log.warning("node %s refused a purge command: %s", node_id, reason[: nodes.MAX_REASON])
    await edge.db.transaction(
        partial(
            nodes.purge_refused,
            node_id=node_id,
            reason=reason,
            nonce=nonce,
            server_id=edge.server_id,
        )
    )


async def _next_answer(edge: Edge, ws: WebSocketConnection, node_id: str) -> dict[str, Any]:
    """The node's next answer to a purge command, read on a stream not welcomed."""
    while True:
        message = _decode(await ws.get_message())
        if message.get("type") in _PURGE_ANSWERS:
            await _record_answer(edge, node_id, message)
            return message


async def _purge(
    edge: Edge,
    ws: WebSocketConnection,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    challenge: bytes,
    next_answer: Callable[[], Awaitable[dict[str, Any]]],
) -> None:
    """Send the signed purge command; forget the node once it answers that it goes."""
    command = purge_command.sign(
        edge.cluster.cluster_ca, cluster=edge.cluster.name, node_id=node_id, challenge=challenge
    )
    await _send(ws, "purge", command=command.command, signature=command.signature)
    with trio.move_on_after(PURGE_ANSWER_TIMEOUT) as waiting:
        while True:
            answer = await next_answer()
            if answer.get("type") == "purge_refused":
                await _refuse(ws, node_id, "purging")
                await ws.aclose(CLOSE_BLOCKED, "purging")
                return
            if answer.get("nonce") == command.nonce:
                break
    if waiting.cancelled_caught:
        log.warning("node %s did not answer its purge command; it stays purging", node_id)
        return
    forgotten = await edge.db.transaction(
        partial(
            nodes.purged, node_id=node_id, key=key, nonce=command.nonce, server_id=edge.server_id
        )
    )
    log.info("node %s purged%s", node_id, "" if forgotten else " (it was deleted meanwhile)")
    await _send(ws, "forgotten", node_id=node_id)
    await ws.aclose()


# --- reconciling -------------------------------------------------------------------------


@dataclass
class StreamReconciler:
    """Asks every second whether the nodes with a stream here are all still accepted.

    Notifications end streams within milliseconds; this is the backstop that keeps a
    block inside its two seconds when one is lost.
    """

    db: Database
    hub: EventHub
    open: collections.Counter[str] = field(default_factory=collections.Counter)

    def __len__(self) -> int:
        return self.open.total()

    def opened(self, node_id: str) -> None:
        self.open[node_id] += 1

    def closed(self, node_id: str) -> None:
        self.open[node_id] -= 1
        if self.open[node_id] <= 0:
            del self.open[node_id]

    async def check(self) -> None:
        watched = list(self.open)
        if not watched:
            return
        stale = await self.db.transaction(lambda conn: nodes.not_accepted(conn, watched))
        for node_id in stale:
            self.hub.wake(node_id)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(RECONCILE_EVERY)
            try:
                await self.check()
            except psycopg.Error as e:
                log.warning("could not reconcile the states of %d streamed nodes: %s", len(self), e)
