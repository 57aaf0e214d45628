"""What every part of the edge shares: its state and how messages are sent and read."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import trio

from oz0 import audit, nodes
from oz0.cluster import Cluster
from oz0.file_blob_cache import BlobCache
from oz0.jobs import parts
from oz0.server.edge.attempt_refusals import AttemptRefusals
from oz0.server.edge.directory import EdgeDirectory
from oz0.server.edge.heartbeats import Heartbeats
from oz0.server.edge.join_batch import JoinBatcher
from oz0.server.edge.join_refusals import JoinRefusals
from oz0.server.edge.metrics import EdgeMetrics
from oz0.server.edge.output_writes import output_writes
from oz0.server.edge.part_ends import PartEnds
from oz0.server.edge.tracking import SeenTracker, StreamReconciler
from oz0.server.edge.wire import Wire
from oz0.server.session_relay import SessionRelay
from oz0.store.batches import Batches
from oz0.store.events import EventHub
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Conn, Database
from oz0.temporal.namespaces import InNamespace
from oz0_common import json_object

if TYPE_CHECKING:
    pass

log = logging.getLogger(__name__)
T = TypeVar("T")

# Bounds on what a peer that has not authenticated can make the edge hold (docs/node-protocol.md).
FIRST_MESSAGE_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
MAX_MESSAGE_SIZE = 64 * 1024
CLOSE_BLOCKED = 4403
# The websocket's own code for a server going down (RFC 6455), after a `move`.
CLOSE_GOING_AWAY = 1001
HANDSHAKE_THREADS = 4
# Node agents never resume a TLS session: tickets would only cost each handshake.
TLS_TICKETS = 0
# Streams whose nodes changed together (a selector's block of hundreds) read them back in
# statements of at most this many nodes.
STATE_READS = 256
# Nodes' attempt messages (attempts.py) this edge has at Temporal at once; past that, one
# is dropped (counted): the node says it again within a second.
ATTEMPT_CALLS = 64
# Nodes' attempt messages this edge answers from rows at once (attempts.py): a streamed
# part's end, a batched write (part_ends.py), and an attempt_alive's read of the rows. Not
# Temporal calls: a fan-out's hundreds of ends at once all go in the next batches rather
# than most being answered `unavailable` and sent again a second later.
ROW_WORK = 4096


def state_reads(db: Database) -> Batches:
    """Control streams' re-reads of their nodes (nodes.ControlStateRead) that come together,
    answered in one statement each batch."""
    return Batches(db, (), max_batch=STATE_READS, together=nodes.control_states)


@dataclass
class Edge:
    # The edge's share of the pool (listener.EDGE_QUERIES connections at a time).
    db: Database
    cluster: Cluster
    server_id: str
    hub: EventHub
    directory: EdgeDirectory
    seen: SeenTracker
    streams: StreamReconciler
    join_refusals: JoinRefusals
    # This server's Temporal frontend, as nodes reach it (for their runtime); None when
    # the edge runs without an advertise address.
    temporal: str | None = None
    # Shared by every connection's reads, so an outage is one log line, not one per node.
    outage: Outage = field(default_factory=lambda: Outage("the edge's database reads", log))
    max_pending: int = nodes.MAX_PENDING
    metrics: EdgeMetrics = field(default_factory=EdgeMetrics)
    # For the re-read of a node that changed, which a block waits on: not queued behind
    # the share's crowd. None: `db`.
    prompt_db: Database | None = None
    # Worker threads for the TLS handshakes' cryptography (wire.tls_handshake).
    handshake_threads: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(HANDSHAKE_THREADS)
    )
    # Set when the server begins to stop: the edge accepts no more connections, and each
    # control stream tells its node to move to another server and ends.
    leaving: trio.Event = field(default_factory=trio.Event)
    # Temporal for the attempts nodes report on (attempts.py); None: this edge makes no
    # such call (it answers `unavailable`).
    in_namespace: InNamespace | None = None
    # Those calls under way, at most ATTEMPT_CALLS (taken and given back by attempts.py).
    attempt_calls: trio.CapacityLimiter = field(
        default_factory=lambda: trio.CapacityLimiter(ATTEMPT_CALLS)
    )
    # Those messages being answered from rows, at most ROW_WORK.
    row_work: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(ROW_WORK))
    # The node streams held here, for the sessions relayed through them (shared with the
    # management API, which opens them).
    sessions: SessionRelay = field(default_factory=SessionRelay)
    # Pushed files' rows, read once for the many nodes this edge serves (file_serve.py).
    blob_cache: BlobCache = field(default_factory=BlobCache)
    heartbeats: Heartbeats = field(init=False)
    # Joins with a token, written in batches; its `run` is started with the edge.
    joins: JoinBatcher = field(init=False)
    # Re-reads of changed nodes (nodes.ControlStateRead) that come together share one
    # statement, on `prompt`; its `serve` is started with the edge.
    state_reads: Batches = field(init=False)
    # Attempts nodes refused, audited at a bounded rate; its `run` is started with the edge.
    attempt_refusals: AttemptRefusals = field(init=False)
    # Streamed parts' ends (part_ends.py), written in batches and told to their workflows;
    # its `run` is started with the edge.
    part_ends: PartEnds = field(init=False)
    # Output chunks, written in batches (output_writes.py); its `serve` is started with
    # the edge.
    output_writes: Batches = field(init=False)
    # Streams' reads of their nodes' streamed attempts (deliveries.py), together when they
    # come together; its `serve` is started with the edge.
    waiting_reads: Batches = field(init=False)

    def __post_init__(self) -> None:
        self.attempt_refusals = AttemptRefusals(self.db)
        self.part_ends = PartEnds(self.db, lambda: self.in_namespace)
        self.output_writes = output_writes(self.db)
        self.waiting_reads = Batches(self.db, (), together=parts.read_together)
        self.heartbeats = Heartbeats(lambda: self.directory.edges)
        self.joins = JoinBatcher(self.transaction, lambda: self.cluster.cluster_ca)
        self.state_reads = state_reads(self.prompt)

    @property
    def prompt(self) -> Database:
        return self.prompt_db if self.prompt_db is not None else self.db

    @property
    def actor(self) -> audit.Actor:
        return audit.Actor("server", self.server_id)

    async def transaction(self, work: Callable[[Conn], T]) -> T:
        """WORK in one transaction; DatabaseUnavailable (the node is told to come back
        later) if the database cannot be reached."""
        try:
            result = await self.db.transaction(work)
        except DATABASE_ERRORS as e:
            self.outage.failed(e)
            raise DatabaseUnavailable from None
        self.outage.worked()
        return result


class DatabaseUnavailable(Exception):
    """The database is unreachable: the edge answers `unavailable` and closes."""

    code = "unavailable"
    message = "the cluster's database is unavailable; try again shortly"


async def send(ws: Wire, kind: str, **fields: Any) -> None:
    await ws.send_message(json.dumps({"type": kind, **fields}))


def decode(raw: str | bytes) -> dict[str, Any]:
    """One message as a JSON object, or ValueError saying why it is not one."""
    try:
        return json_object.parse(raw)
    except json_object.TooDeep:
        raise ValueError("messages must not be nested this deeply") from None
    except json_object.NotAnObject:
        raise ValueError("messages must be JSON objects") from None


async def receive_first(ws: Wire) -> dict[str, Any]:
    with trio.fail_after(FIRST_MESSAGE_TIMEOUT):
        raw = await ws.get_message()
    return decode(raw)


async def close(ws: Wire, code: int = 1000, reason: str | None = None) -> None:
    """Close with a close frame, waiting at most CLOSE_TIMEOUT for the peer's answer.

    `Wire.aclose` waits for the peer's own close frame, which a peer may never send;
    cancelled, it still closes the socket under it.
    """
    with trio.move_on_after(CLOSE_TIMEOUT) as waiting:
        await ws.aclose(code, reason)
    if waiting.cancelled_caught:
        log.debug("a peer did not answer our close frame in %g s", CLOSE_TIMEOUT)


async def refuse(ws: Wire, node_id: str, state: str | None) -> None:
    code = state or "unknown"
    await send(ws, "refused", code=code, message=f"node {node_id} is {code}")
