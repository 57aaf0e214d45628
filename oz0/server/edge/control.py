"""`/control`: an accepted node's stream, ended as soon as it stops being accepted, or
with a `move` when the server stops (the node goes to another server at once)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import trio
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import nodes, pki
from oz0.server.edge import attempt_refusals, attempts, deliveries, job_output, renew
from oz0.server.edge.common import CLOSE_BLOCKED, CLOSE_GOING_AWAY, Edge, close, refuse, send
from oz0.server.edge.heartbeats import HEARTBEATS, Beat
from oz0.server.edge.purge import PURGE_ANSWERS, decode, next_answer, purge
from oz0.server.edge.wire import Closed, Wire
from oz0.store.events import NodeWatch
from oz0.store.outage import Outage, until_it_works

log = logging.getLogger(__name__)

# Answers to purge commands kept for the purge to read; older ones give way to newer.
ANSWERS_KEPT = 4


class PurgeAnswers:
    """A node's latest answers to purge commands, for the purge waiting on one.

    Answers the node sent unasked (before any command, or naming another) give way to
    newer ones, so the answer to the command sent always reaches the purge however many
    came before it; a bounded queue that refused the newest would lose exactly that one.
    """

    def __init__(self) -> None:
        self._kept: collections.deque[dict[str, Any]] = collections.deque(maxlen=ANSWERS_KEPT)
        self._arrived = trio.lowlevel.ParkingLot()

    def offer(self, answer: dict[str, Any]) -> None:
        self._kept.append(answer)
        self._arrived.unpark_all()

    async def next(self) -> dict[str, Any]:
        while not self._kept:
            await self._arrived.park()
        return self._kept.popleft()


async def serve_control(edge: Edge, ws: Wire, peer_der: bytes | None, challenge: bytes) -> None:
    node_id, key = _node_of(peer_der, edge.cluster.name)
    if node_id is None or key is None:
        await send(
            ws, "refused", code="unknown", message="a node certificate of this cluster is required"
        )
        return
    # The reconcile loop covers this stream after a LISTEN gap (see StreamReconciler).
    with edge.hub.watch_node(node_id, wake_on_gap=False) as changed:
        node = await edge.transaction(
            lambda conn: nodes.control_connect(conn, node_id, key, edge.server_id)
        )
        state = node.state if node is not None else None
        if state == "purging":
            await purge(edge, ws, node_id, key, challenge, partial(next_answer, edge, ws, node_id))
            return
        if node is None or state != "accepted":
            await refuse(ws, node_id, state)
            return
        edge.seen.alive(node_id)
        edge.streams.opened(node_id)
        beat: Beat | None = None
        try:
            await send(
                ws,
                "welcome",
                node_id=node_id,
                server=edge.server_id,
                heartbeat=nodes.HEARTBEAT,
                edges=edge.directory.edges,
                temporal=edge.temporal,
                tenant=node.tenant,
            )
            answers = PurgeAnswers()
            # Set once this edge ends the stream: from then on the node is shown gone.
            ending = trio.Event()
            # Held while a renewal is answered: its new key ends this stream (opened with
            # the old certificate), but only once the node has the new one.
            renewing = trio.Lock()
            async with trio.open_nursery() as nursery:
                beat = edge.heartbeats.add(ws, node_id, nursery.cancel_scope)
                sending = deliveries.Deliveries(edge, ws, node_id)
                reports = attempts.NodeAttempts(edge, ws, node_id, node.tenant, nursery, sending)
                nursery.start_soon(sending.run)
                nursery.start_soon(
                    _receive_from_node,
                    edge,
                    ws,
                    beat,
                    node.tenant,
                    reports,
                    sending,
                    key,
                    answers,
                    ending,
                    renewing,
                    nursery.cancel_scope,
                )
                nursery.start_soon(
                    _act_on_changes,
                    edge,
                    ws,
                    node_id,
                    key,
                    changed,
                    node.revision,
                    answers.next,
                    challenge,
                    ending,
                    renewing,
                    nursery.cancel_scope,
                )
                nursery.start_soon(
                    _move_when_leaving, edge, ws, node_id, ending, renewing, nursery.cancel_scope
                )
            if beat.silent:
                log.warning("node %s silent for three heartbeats; closed its stream", node_id)
        finally:
            if beat is not None:
                edge.heartbeats.remove(beat)
            edge.streams.closed(node_id)
            if not edge.streams.count(node_id):
                # Not while the node's newer stream is open here (it reconnected, with a
                # renewed certificate say, before this one was over): it is connected.
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


async def _receive_from_node(
    edge: Edge,
    ws: Wire,
    beat: Beat,
    tenant: str,
    reports: attempts.NodeAttempts,
    sending: deliveries.Deliveries,
    key: ec.EllipticCurvePublicKey,
    answers: PurgeAnswers,
    ending: trio.Event,
    renewing: trio.Lock,
    scope: trio.CancelScope,
) -> None:
    """Anything from the node is a sign of life (edge.heartbeats ends a silent stream).

    Answers to a purge command go to whoever sent it, who alone records them; a `renew`
    is answered (renew.py); a job's output is stored and acknowledged (job_output.py); an
    attempt the node refused is audited, within its budget (attempt_refusals.py); what
    the node says of its running attempts goes to Temporal (attempts.py), in tasks of
    their own, and how many it runs at once to its row.
    """
    node_id = beat.node_id
    try:
        while True:
            raw = await ws.get_message()
            beat.heard = trio.current_time()
            if not ending.is_set():
                edge.seen.alive(node_id)
            if raw in HEARTBEATS:
                continue
            message = decode(raw)
            if message.get("type") in PURGE_ANSWERS:
                answers.offer(message)
            elif message.get("type") == renew.RENEW:
                async with renewing:
                    await renew.answer(edge, ws, node_id, key, message)
            elif message.get("type") == job_output.OUTPUT:
                await job_output.receive(edge, ws, node_id, message)
            elif message.get("type") == attempt_refusals.REFUSED:
                await edge.attempt_refusals.refused(node_id, tenant, message)
            elif message.get("type") in (attempts.ALIVE, attempts.DONE, attempts.MAX_JOBS_SAID):
                await reports.received(message)
            elif message.get("type") == deliveries.TAKEN:
                await sending.answered(message)
    except Closed:
        pass
    scope.cancel()


async def _act_on_changes(
    edge: Edge,
    ws: Wire,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    changed: NodeWatch,
    revision: int,
    next_answer: Callable[[], Awaitable[dict[str, Any]]],
    challenge: bytes,
    ending: trio.Event,
    renewing: trio.Lock,
    scope: trio.CancelScope,
) -> None:
    """End the stream when the node stops being accepted, purging it first if it is purging.

    Woken by a notification about the node, whose news (its state, key and revision) says
    what changed since the node was read at REVISION; by the reconcile loop if one was
    lost, or a notification without news, after which the node is read back. A database
    that cannot be read leaves the stream as it is: the node keeps working while the
    database is away, and the read is tried again until it answers.
    """
    outage = Outage(f"re-reading the state of streamed node {node_id}", log)
    state: str | None = "accepted"
    while state == "accepted":
        news = await changed.wait()
        # When the edge learned of the change that ends the stream (for its metrics).
        learned = trio.current_time()
        if news is None:
            edge.metrics.node_reread()
            node = await until_it_works(
                outage,
                partial(edge.state_reads.run, nodes.ControlStateRead(node_id, key)),
            )
            state = node.state if node is not None else None
            if node is not None:
                revision = node.revision
        elif news.newer_than(revision):
            # The key's hash only now: thousands of streams open at once in a storm.
            state, revision = news.state_for(nodes.public_key_sha256(key)), news.revision
    if state == "purging":
        await purge(edge, ws, node_id, key, challenge, next_answer)
    else:
        # A renewal answered on this stream notifies its new key before the answer is
        # sent: the node gets its new certificate before this stream ends.
        async with renewing:
            pass
        log.info("node %s is %s now; ending its stream", node_id, state or "unknown")
        # Shown gone now, not once the close handshake is over: a node slow to answer our
        # close frame holds it up to CLOSE_TIMEOUT.
        ending.set()
        if edge.streams.count(node_id) <= 1:  # this stream only
            edge.seen.left(node_id)
        try:
            await refuse(ws, node_id, state)
            await close(ws, CLOSE_BLOCKED, state or "unknown")
        finally:
            # Also when the node closed first (our close is then cancelled, see
            # _receive_from_node): either way the stream has ended now.
            edge.metrics.stream_ended(state, trio.current_time() - learned)
    scope.cancel()


async def _move_when_leaving(
    edge: Edge,
    ws: Wire,
    node_id: str,
    ending: trio.Event,
    renewing: trio.Lock,
    scope: trio.CancelScope,
) -> None:
    """When the server begins to stop (edge.leaving), tell the node to move to another
    server now and end the stream: it reconnects at once, not after a timeout or a backoff.

    The `move` names the other servers' edges up; an agent that does not know `move`
    ignores it and sees the stream end (close code 1001, going away).
    """
    await edge.leaving.wait()
    # A renewal being answered finishes first: the node must not lose its new certificate.
    async with renewing:
        ending.set()
        own = edge.directory.own
        await send(
            ws,
            "move",
            edges=[e for e in edge.directory.edges if e != own],
            message=f"server {edge.server_id} is stopping",
        )
        await close(ws, CLOSE_GOING_AWAY, "server stopping")
    log.debug("node %s told to move; its stream ended", node_id)
    scope.cancel()
