"""Between a person's session (its websocket on the management API, api/sessions.py) and
the node's control stream this server's edge holds (edge/control.py), in this process.

A session is relayed by the server that holds the node's stream, and only by it: the CLI
that reached another server is told which (`elsewhere`, from the node's `server` column)
and connects there. One hop, no relay between servers: a keystroke crosses one server,
and nothing is lost in a second queue nor waits on PostgreSQL's NOTIFY (whose
round trip and per-transaction cost are no place for every keystroke).

The edge attaches each node stream it holds (`attach`) and detaches it when the stream
ends, which ends its sessions at once: a node blocked, purged or deleted loses its stream
within the edge's 2 s bound, and its sessions with it. What the node sends about a
session reaches the session's queue (`from_node`); a person too slow to read it loses
the session rather than hold up the node's stream (its heartbeats, its jobs).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio

from oz0_common import session_messages as sm

log = logging.getLogger(__name__)

# Messages from the node a session may have waiting for its person (output is read from
# the PTY in pieces of up to 64 KiB): past it, the person reads too slowly.
QUEUE = 512


class LineGone(Exception):
    """The node's stream ended: nothing more reaches the node through it."""


@dataclass(frozen=True)
class NodeLine:
    """One node's control stream as sessions use it: `send` a message to the node
    (LineGone once the stream has ended)."""

    node_id: str
    tenant: str
    send: Callable[..., Awaitable[None]]


@dataclass
class LiveSession:
    id: str
    node_id: str
    line: NodeLine
    _in: trio.MemorySendChannel[dict[str, Any]] = field(repr=False)
    messages: trio.MemoryReceiveChannel[dict[str, Any]] = field(repr=False)
    # Why it ended on this side (the node's stream ended, too slow a reader), once it has.
    why: str | None = None

    def offer(self, message: dict[str, Any]) -> None:
        try:
            self._in.send_nowait(message)
        except trio.WouldBlock:
            self.end("the session's output came faster than it was read")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            pass

    def end(self, why: str) -> None:
        if self.why is None:
            self.why = why
        self._in.close()


class SessionRelay:
    """The node streams this server holds and the sessions relayed through them."""

    def __init__(self) -> None:
        self._lines: dict[str, NodeLine] = {}
        self._sessions: dict[str, LiveSession] = {}

    def attach(self, line: NodeLine) -> None:
        self._lines[line.node_id] = line

    def detach(self, line: NodeLine, why: str) -> None:
        """LINE's stream ended: so do its sessions."""
        if self._lines.get(line.node_id) is line:
            del self._lines[line.node_id]
        for session in list(self._sessions.values()):
            if session.line is line:
                session.end(why)

    def line(self, node_id: str) -> NodeLine | None:
        return self._lines.get(node_id)

    def open(self, session_id: str, line: NodeLine) -> LiveSession:
        into, out = trio.open_memory_channel[dict[str, Any]](QUEUE)
        session = LiveSession(session_id, line.node_id, line, into, out)
        self._sessions[session_id] = session
        return session

    def close(self, session: LiveSession) -> None:
        if self._sessions.get(session.id) is session:
            del self._sessions[session.id]
        session.end("closed")

    def live(self) -> list[LiveSession]:
        return list(self._sessions.values())

    def from_node(self, node_id: str, message: dict[str, Any]) -> None:
        """A session message from NODE_ID's stream, to its session (if it is still here
        and that node's: a node cannot speak for another's session)."""
        try:
            session_id = sm.session_of(message)
        except sm.BadSessionMessage as e:
            log.debug("node %s: %s", node_id, e)
            return
        session = self._sessions.get(session_id)
        if session is not None and session.node_id == node_id:
            session.offer(message)
