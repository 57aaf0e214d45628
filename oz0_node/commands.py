"""What the agent does with each message the edge sends on a live control stream.

One handler per message type in HANDLERS. Commands the edge will send later (block, purge)
plug in here: a handler gets the live stream (to answer through `stream.conn`), the node
(to record a new state) and the pinned CA (to verify a signed command). A handler that
ends the stream raises: `EdgeUnavailable` to reconnect, `AgentError` to stop the agent.
Unknown types are logged and ignored, so an older agent survives a newer edge.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import trio

from oz0_common import session_messages as sm
from oz0_common.attempt_messages import ATTEMPT, STOP
from oz0_common.file_push import DATA as FILE_DATA
from oz0_node import purge, renewal
from oz0_node.errors import AgentError, EdgeLeaving, EdgeUnavailable
from oz0_node.jobs.edge_link import DONE_ACK, OUTPUT_ACK, EdgeLink
from oz0_node.jobs.intake import Intake
from oz0_node.jobs.manager import AttemptManager
from oz0_node.messages import Hello, Message, Refusal, edge_list, kind
from oz0_node.node import Node
from oz0_node.sessions import NodeSessions
from oz0_node.transport import EdgeConnection

log = logging.getLogger(__name__)

# After `purged`, how long the edge has to confirm with `forgotten`; the files go either way.
FORGOTTEN_TIMEOUT = 10.0


@dataclass(frozen=True)
class LiveStream:
    """A control stream from its `hello` on."""

    node: Node
    conn: EdgeConnection
    ca_pem: bytes
    hello: Hello
    nonces: purge.PurgeMemory
    # The attempts' link while this stream is up: their acks come back to it.
    jobs: EdgeLink
    # The agent's attempts, which the edge may tell to stop (`attempt_stop`).
    attempts: AttemptManager | None = None
    # Attempts the edge sends over the stream (`attempt`).
    intake: Intake | None = None
    # Interactive sessions opened on this stream (sessions.py): they end with it.
    sessions: NodeSessions | None = None


Handler = Callable[[LiveStream, Message], Awaitable[None]]


class NodeRefused(EdgeUnavailable):
    """The edge refused this node for now (blocked, pending, purging): try again later."""


def take_refusal(node: Node, refusal: Refusal, address: str) -> Exception:
    """What a `refused` means for the agent: an error to raise, after recording the state.

    `purging` follows a purge command this agent refused; the edge signs a fresh one for
    the next stream, so it is asked again just as when blocked.
    """
    if refusal.code == "purging":
        # Not written to node.json: after a purge refused because the directory does not
        # hold this node's identity, the agent must not write its identity back there.
        return NodeRefused(f"edge {address} refused node {node.name}: {refusal.message}")
    if refusal.code in ("blocked", "pending"):
        node.remember(state=refusal.code)
        return NodeRefused(f"edge {address} refused node {node.name}: {refusal.message}")
    if refusal.code == "rejected":
        node.remember(state="rejected")
        return AgentError(f"node {node.name} was rejected: {refusal.message}")
    if refusal.code == "unknown":
        return AgentError(
            f"the cluster does not know node {node.name} ({refusal.message}); "
            f"to join again, start with a new --data-dir"
        )
    return EdgeUnavailable(
        f"edge {address} refused the control stream with unknown code "
        f"{refusal.code!r}: {refusal.message}"
    )


async def _on_heartbeat(stream: LiveStream, message: Message) -> None:
    """Nothing to do: receiving anything already proved the stream alive."""


async def _on_edges(stream: LiveStream, message: Message) -> None:
    stream.node.remember(edges=edge_list(message, stream.conn.address))


async def _on_move(stream: LiveStream, message: Message) -> None:
    """The edge's server is stopping: learn the other edges it names and end the stream;
    the reconnect policy goes to another edge at once (`Reconnect.move_now`)."""
    address = stream.conn.address
    towards = edge_list(message, address)
    stream.node.remember(edges=towards)
    why = message.get("message")
    raise EdgeLeaving(f"edge {address} asked node {stream.node.name} to move: {why}", towards)


async def _on_job_output_ack(stream: LiveStream, message: Message) -> None:
    stream.jobs.deliver(OUTPUT_ACK, message)


async def _on_file_data(stream: LiveStream, message: Message) -> None:
    """A piece of a file being pushed here, to the push waiting for it (jobs/file_push.py)."""
    stream.jobs.deliver(FILE_DATA, message)


async def _on_attempt_done_ack(stream: LiveStream, message: Message) -> None:
    stream.jobs.deliver(DONE_ACK, message)


async def _on_attempt_stop(stream: LiveStream, message: Message) -> None:
    """The cluster no longer runs that attempt here (cancelled, moved on, failed): end it."""
    job, attempt, why = message.get("job"), message.get("attempt"), message.get("why")
    if (
        not isinstance(job, str)
        or not isinstance(attempt, int)
        or isinstance(attempt, bool)
        or stream.attempts is None
    ):
        log.warning("ignoring a malformed attempt_stop from edge %s", stream.conn.address)
        return
    stream.attempts.stop(job, attempt, why if isinstance(why, str) and why else "ended")


async def _on_attempt(stream: LiveStream, message: Message) -> None:
    """An attempt to run (jobs/intake.py): answered, started in a task of its own."""
    if stream.intake is None:
        log.warning(
            "ignoring an attempt from edge %s: this agent runs no jobs", stream.conn.address
        )
        return
    stream.intake.received(message)


async def _on_session(stream: LiveStream, message: Message) -> None:
    """A session message (sessions.py); an agent without sessions refuses an open."""
    sessions = stream.sessions
    if sessions is None:
        return
    handler = {
        sm.OPEN: sessions.opened,
        sm.INPUT: sessions.input,
        sm.RESIZE: sessions.resize,
        sm.CLOSE: sessions.close,
    }[kind(message)]
    await handler(message)


async def _on_refused(stream: LiveStream, message: Message) -> None:
    address = stream.conn.address
    refusal = Refusal.parse(message, address)
    if refusal.code == "unknown" and stream.node.identity.has_next_key():
        # A renewal under way: the cluster swapped the key and ends streams of the old one,
        # maybe before its answer got here. The next stream picks the renewal up.
        raise EdgeUnavailable(
            f"edge {address} ended the stream of node {stream.node.name}'s old certificate "
            f"during its renewal"
        )
    raise take_refusal(stream.node, refusal, address)


async def answer_purge(stream: LiveStream, message: Message) -> None:
    """Answer a `purge` command: returns if refused, raises PurgeConfirmed if it passes.

    Refused: `purge_refused` with the reason, the files stay, and the edge ends the stream
    with `refused` code `purging`. Passed: `purged`, then up to FORGOTTEN_TIMEOUT for
    `forgotten`; whatever comes instead, the verified command stands.
    """
    node, conn = stream.node, stream.conn
    assert node.record.node_id is not None  # a control stream needs the node's certificate
    try:
        command = purge.verify(
            message,
            identity=node.identity,
            cluster=node.record.cluster,
            node_id=node.record.node_id,
            challenge=stream.hello.challenge,
            nonces=stream.nonces,
        )
    except purge.CommandRefused as refused:
        log.warning("refused a purge command from edge %s: %s", conn.address, refused.reason)
        await conn.send("purge_refused", nonce=refused.nonce, reason=refused.reason)
        return
    log.warning(
        "edge %s delivered a valid purge command for node %s (nonce %s, issued %s)",
        conn.address,
        command.node_id,
        command.nonce,
        command.issued_at or "at an unknown time",
    )
    await conn.send("purged", nonce=command.nonce)
    await _await_forgotten(conn)
    raise purge.PurgeConfirmed(command)


async def _await_forgotten(conn: EdgeConnection) -> None:
    deadline = trio.current_time() + FORGOTTEN_TIMEOUT
    while (remaining := deadline - trio.current_time()) > 0:
        try:
            message = await conn.receive(remaining)
        except EdgeUnavailable as e:
            log.info("no confirmation that the cluster forgot the node (%s); purging anyway", e)
            return
        if kind(message) == "heartbeat":
            continue
        if kind(message) == "forgotten":
            log.info("edge %s confirmed: the cluster forgot this node", conn.address)
        else:
            log.info(
                "edge %s sent %r instead of forgotten; purging anyway",
                conn.address,
                kind(message),
            )
        return
    log.info("edge %s sent no forgotten in %g s; purging anyway", conn.address, FORGOTTEN_TIMEOUT)


HANDLERS: dict[str, Handler] = {
    "heartbeat": _on_heartbeat,
    "edges": _on_edges,
    "move": _on_move,
    "refused": _on_refused,
    "purge": answer_purge,
    "renewed": renewal.on_renewed,
    "renew_refused": renewal.on_renew_refused,
    "job_output_ack": _on_job_output_ack,
    DONE_ACK: _on_attempt_done_ack,
    STOP: _on_attempt_stop,
    ATTEMPT: _on_attempt,
    **dict.fromkeys((sm.OPEN, sm.INPUT, sm.RESIZE, sm.CLOSE), _on_session),
    FILE_DATA: _on_file_data,
}


async def dispatch(stream: LiveStream, message: Message) -> None:
    handler = HANDLERS.get(kind(message))
    if handler is None:
        log.warning(
            "ignoring a %r message from edge %s: this agent does not know it",
            kind(message),
            stream.conn.address,
        )
        return
    await handler(stream, message)
