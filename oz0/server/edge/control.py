"""`/control`: an accepted node's stream, ended as soon as it stops being accepted, or
with a `move` when the server stops (the node goes to another server at once).

The edge's side of one stream is one object, `ControlStream`, holding what its tasks
share: the node, its key and tenant, the wire, its heartbeat, its purge answers, the lock a
renewal holds, and the scope that ends them all. Its receive loop hands each message from
the node to the handler its type names in HANDLERS, as the node's side does with the
edge's (oz0_node/commands.py); a type without one is ignored.
"""

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
from oz0.server.edge import (
    attempt_refusals,
    attempts,
    deliveries,
    file_serve,
    job_output,
    renew,
)
from oz0.server.edge.common import CLOSE_BLOCKED, CLOSE_GOING_AWAY, Edge, close, refuse, send
from oz0.server.edge.heartbeats import HEARTBEATS, Beat
from oz0.server.edge.purge import PURGE_ANSWERS, decode, next_answer, purge
from oz0.server.edge.wire import Closed, Wire
from oz0.server.session_relay import LineGone, NodeLine
from oz0.store.events import NodeWatch
from oz0.store.outage import Outage, until_it_works
from oz0_common import session_messages
from oz0_common.attempt_messages import ALIVE, DONE, MAX_JOBS, TAKEN
from oz0_common.file_push import GET as FILE_GET

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
        # Recorded connected, and alive, before any write of its last stream here as gone
        # that was not under way yet (SeenTracker): `node show` says connected from the
        # welcome on.
        async with edge.seen.connecting(node_id):
            node = await edge.transaction(
                lambda conn: nodes.control_connect(conn, node_id, key, edge.server_id)
            )
            state = node.state if node is not None else None
            if state == "accepted":
                edge.seen.alive(node_id)
        if state == "purging":
            await purge(edge, ws, node_id, key, challenge, partial(next_answer, edge, ws, node_id))
            return
        if node is None or state != "accepted":
            await refuse(ws, node_id, state)
            return
        edge.streams.opened(node_id)
        beat: Beat | None = None
        line: NodeLine | None = None
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
            async with trio.open_nursery() as nursery:
                beat = edge.heartbeats.add(ws, node_id, nursery.cancel_scope)
                stream = ControlStream(
                    edge, ws, node_id, key, node.tenant, challenge, beat, nursery
                )
                stream.start(changed, node.revision)
                line = NodeLine(node_id, node.tenant, partial(_send_to_node, ws))
                edge.sessions.attach(line)
            if beat.silent:
                log.warning("node %s silent for three heartbeats; closed its stream", node_id)
        finally:
            if line is not None:
                edge.sessions.detach(line, f"node {node_id}'s stream to this server ended")
            if beat is not None:
                edge.heartbeats.remove(beat)
            edge.streams.closed(node_id)
            if not edge.streams.count(node_id):
                # Not while the node's newer stream is open here (it reconnected, with a
                # renewed certificate say, before this one was over): it is connected.
                edge.seen.left(node_id)


async def _send_to_node(ws: Wire, kind: str, **fields: Any) -> None:
    """A session's message to the node (session_relay.NodeLine)."""
    try:
        await send(ws, kind, **fields)
    except Closed:
        raise LineGone(f"the stream of the node ended ({kind} not sent)") from None


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


Handler = Callable[["ControlStream", dict[str, Any]], Awaitable[None]]


class ControlStream:
    """The edge's side of one accepted node's control stream, from its `welcome` on.

    Its tasks run in one nursery, beside the attempts' deliveries: `_receive` (what the
    node sends), `_act_on_changes` (the node stops being accepted) and
    `_move_when_leaving` (the server stops). Whichever ends the stream cancels the
    nursery's scope, and with it the others.
    """

    def __init__(
        self,
        edge: Edge,
        ws: Wire,
        node_id: str,
        key: ec.EllipticCurvePublicKey,
        tenant: str,
        challenge: bytes,
        beat: Beat,
        nursery: trio.Nursery,
    ) -> None:
        self.edge = edge
        self.ws = ws
        self.node_id = node_id
        self.key = key
        self.tenant = tenant
        self.challenge = challenge
        self.beat = beat
        self._nursery = nursery
        self.scope = nursery.cancel_scope
        self.answers = PurgeAnswers()
        # Set once this edge ends the stream: from then on the node is shown gone.
        self.ending = trio.Event()
        # Held while a renewal is answered: its new key ends this stream (opened with
        # the old certificate), but only once the node has the new one.
        self.renewing = trio.Lock()
        self.sending = deliveries.Deliveries(edge, ws, node_id)
        self.reports = attempts.NodeAttempts(edge, ws, node_id, tenant, nursery, self.sending)
        # The node's file_get reads under way (file_serve.py), bounded.
        self.file_reads = file_serve.FileReads()

    def start(self, changed: NodeWatch, revision: int) -> None:
        """The stream's tasks, in its nursery; CHANGED wakes on news of the node, last read
        at REVISION."""
        nursery = self._nursery
        nursery.start_soon(self.sending.run)
        nursery.start_soon(self._receive)
        nursery.start_soon(self._act_on_changes, changed, revision)
        nursery.start_soon(self._move_when_leaving)

    async def _receive(self) -> None:
        """Anything from the node is a sign of life (edge.heartbeats ends a silent stream);
        a heartbeat is nothing more, anything else goes to its handler (`_dispatch`)."""
        try:
            while True:
                raw = await self.ws.get_message()
                self.beat.heard = trio.current_time()
                if not self.ending.is_set():
                    self.edge.seen.alive(self.node_id)
                if raw in HEARTBEATS:
                    continue
                await self._dispatch(decode(raw))
        except Closed:
            pass
        self.scope.cancel()

    async def _dispatch(self, message: dict[str, Any]) -> None:
        """MESSAGE to the handler of its type in HANDLERS; ignored if it has none. A type
        that is not text has none: looked up, a list would raise and end the stream."""
        kind = message.get("type")
        handler = HANDLERS.get(kind) if isinstance(kind, str) else None
        if handler is not None:
            await handler(self, message)

    async def _on_purge_answer(self, message: dict[str, Any]) -> None:
        """To whoever sent the purge command, who alone records it (purge.py)."""
        self.answers.offer(message)

    async def _on_renew(self, message: dict[str, Any]) -> None:
        """Answered (renew.py) holding `renewing`, so that neither a change of the node nor
        the server stopping ends the stream before the node has its new certificate."""
        async with self.renewing:
            await renew.answer(self.edge, self.ws, self.node_id, self.key, message)

    async def _on_job_output(self, message: dict[str, Any]) -> None:
        """A job's output: stored and acknowledged (job_output.py)."""
        await job_output.receive(self.edge, self.ws, self.node_id, message)

    async def _on_attempt_refused(self, message: dict[str, Any]) -> None:
        """An attempt the node refused: audited, within its budget (attempt_refusals.py)."""
        await self.edge.attempt_refusals.refused(self.node_id, self.tenant, message)

    async def _on_attempt_report(self, message: dict[str, Any]) -> None:
        """What the node says of its running attempts goes to Temporal (attempts.py), in
        tasks of their own, and how many it runs at once to its row."""
        await self.reports.received(message)

    async def _on_attempt_taken(self, message: dict[str, Any]) -> None:
        """The node's answer to an attempt sent over this stream (deliveries.py)."""
        await self.sending.answered(message)

    async def _on_session(self, message: dict[str, Any]) -> None:
        """About a session relayed through this stream: to its person (session_relay.py)."""
        self.edge.sessions.from_node(self.node_id, message)

    async def _on_file_get(self, message: dict[str, Any]) -> None:
        """A piece of a blob the node pushes (file_serve.py), read in a task of its own;
        past the stream's cap on reads at once, answered `unavailable` now."""
        if not self.file_reads.take():
            await file_serve.busy(self.ws, message)
            return
        self._nursery.start_soon(self._serve_file, message)

    async def _serve_file(self, message: dict[str, Any]) -> None:
        try:
            await file_serve.serve(self.edge, self.ws, self.node_id, message)
        finally:
            self.file_reads.done()

    async def _act_on_changes(self, changed: NodeWatch, revision: int) -> None:
        """End the stream when the node stops being accepted, purging it first if it is purging.

        Woken by a notification about the node, whose news (its state, key and revision) says
        what changed since the node was read at REVISION; by the reconcile loop if one was
        lost, or a notification without news, after which the node is read back. A database
        that cannot be read leaves the stream as it is: the node keeps working while the
        database is away, and the read is tried again until it answers.
        """
        edge, ws, node_id, key = self.edge, self.ws, self.node_id, self.key
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
            await purge(edge, ws, node_id, key, self.challenge, self.answers.next)
        else:
            # A renewal answered on this stream notifies its new key before the answer is
            # sent: the node gets its new certificate before this stream ends.
            async with self.renewing:
                pass
            log.info("node %s is %s now; ending its stream", node_id, state or "unknown")
            # Shown gone now, not once the close handshake is over: a node slow to answer
            # our close frame holds it up to CLOSE_TIMEOUT.
            self.ending.set()
            if edge.streams.count(node_id) <= 1:  # this stream only
                edge.seen.left(node_id)
            try:
                await refuse(ws, node_id, state)
                await close(ws, CLOSE_BLOCKED, state or "unknown")
            finally:
                # Also when the node closed first (our close is then cancelled, see
                # _receive): either way the stream has ended now.
                edge.metrics.stream_ended(state, trio.current_time() - learned)
        self.scope.cancel()

    async def _move_when_leaving(self) -> None:
        """When the server begins to stop (edge.leaving), tell the node to move to another
        server now and end the stream: it reconnects at once, not after a timeout or a
        backoff.

        The `move` names the other servers' edges up; an agent that does not know `move`
        ignores it and sees the stream end (close code 1001, going away).
        """
        edge = self.edge
        await edge.leaving.wait()
        # A renewal being answered finishes first: the node must not lose its new certificate.
        async with self.renewing:
            self.ending.set()
            own = edge.directory.own
            await send(
                self.ws,
                "move",
                edges=[e for e in edge.directory.edges if e != own],
                message=f"server {edge.server_id} is stopping",
            )
            await close(self.ws, CLOSE_GOING_AWAY, "server stopping")
        log.debug("node %s told to move; its stream ended", self.node_id)
        self.scope.cancel()


# What the edge does with each message a node sends on its live stream, by type.
HANDLERS: dict[str, Handler] = {
    **dict.fromkeys(PURGE_ANSWERS, ControlStream._on_purge_answer),
    renew.RENEW: ControlStream._on_renew,
    job_output.OUTPUT: ControlStream._on_job_output,
    attempt_refusals.REFUSED: ControlStream._on_attempt_refused,
    **dict.fromkeys((ALIVE, DONE, MAX_JOBS), ControlStream._on_attempt_report),
    TAKEN: ControlStream._on_attempt_taken,
    **dict.fromkeys(session_messages.FROM_NODE, ControlStream._on_session),
    FILE_GET: ControlStream._on_file_get,
}
