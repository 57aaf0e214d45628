"""What the edge counts for `/metrics`: joins, refused joins, how fast removed nodes' streams end.

Recording is a counter increment or a histogram observation on a child made in advance,
so a join or a block pays no label lookup.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

# The node's state once its join was answered.
JOINED_STATES = ("pending", "accepted")
# Why a join was refused: the token's reasons (oz0.tokens.RefusalReason), too many nodes
# waiting, labels claimed where the token's are locked, a malformed join, the database
# unavailable.
REFUSAL_REASONS = (
    "unknown",
    "revoked",
    "expired",
    "used_up",
    "pending_limit",
    "labels_locked",
    "bad_request",
    "unavailable",
)
# The node's state that ended its stream; "deleted" when its row is gone. (Only pending
# nodes can be rejected, and they have no stream.)
ENDED_BY = ("blocked", "deleted", "other")
# From a few milliseconds (a notification) past the 2 s bound of a block.
CLOSE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class EdgeMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # Without a registry of the server's, the edge counts into one nobody reads.
        registry = registry if registry is not None else CollectorRegistry()
        joins = Counter(
            "oz0_edge_joins",
            "Joins this server's edge answered with a node ID, by the node's state then.",
            ["state"],
            registry=registry,
        )
        refusals = Counter(
            "oz0_edge_join_refusals",
            "Joins this server's edge refused, by reason.",
            ["reason"],
            registry=registry,
        )
        closes = Histogram(
            "oz0_edge_block_to_close_seconds",
            "From this edge learning that a streamed node is no longer accepted (its"
            " notification, or the re-read it made) to the node's stream closed.",
            ["state"],
            buckets=CLOSE_BUCKETS,
            registry=registry,
        )
        self._shed = Counter(
            "oz0_edge_connections_shed",
            "New connections this server's edge closed before their TLS handshake, as their turn"
            " had not come to them within 2 s (see handshake_turns): too busy then.",
            registry=registry,
        )
        self._over_limit = Counter(
            "oz0_edge_connections_over_limit",
            "New connections this server's edge closed at once, before TLS, as their source"
            " address already held 64 unauthenticated ones or the edge 2,048 (see admission).",
            registry=registry,
        )
        self._rereads = Counter(
            "oz0_edge_node_rereads",
            "Streamed nodes this server's edge read back, as what woke their streams did not"
            " say their state: a lost notification found by the reconcile, say. A block"
            " reaches the edge with the node's new state and needs no read.",
            registry=registry,
        )
        self._alives_dropped = Counter(
            "oz0_edge_attempt_alives_dropped",
            "attempt_alive messages this server's edge set aside unanswered: the stream's"
            " previous one was still at Temporal, or the edge had 64 attempt calls under way"
            " (the node sends another within a second).",
            registry=registry,
        )
        self._dones_refused = Counter(
            "oz0_edge_attempt_dones_refused",
            "attempt_done messages this server's edge answered unavailable at once, having no"
            " room for them (8 per stream; 64 Temporal calls or 4096 answered from rows"
            " per edge); the node sends them"
            " again.",
            registry=registry,
        )
        self._attempt_unavailable = Counter(
            "oz0_edge_attempt_calls_unavailable",
            "Nodes' attempt messages this server's edge could not take to Temporal or the"
            " database (down, or slower than the call's deadline); the node's next one tries"
            " again.",
            registry=registry,
        )
        self._joins = {state: joins.labels(state) for state in JOINED_STATES}
        self._refusals = {reason: refusals.labels(reason) for reason in REFUSAL_REASONS}
        self._closes = {state: closes.labels(state) for state in ENDED_BY}

    def joined(self, state: str) -> None:
        child = self._joins.get(state)
        if child is not None:
            child.inc()

    def connection_shed(self) -> None:
        self._shed.inc()

    def connection_over_limit(self) -> None:
        self._over_limit.inc()

    def node_reread(self) -> None:
        self._rereads.inc()

    def attempt_alive_dropped(self) -> None:
        self._alives_dropped.inc()

    def attempt_done_refused(self) -> None:
        self._dones_refused.inc()

    def attempt_call_unavailable(self) -> None:
        self._attempt_unavailable.inc()

    def join_refused(self, reason: str) -> None:
        self._refusals.get(reason, self._refusals["bad_request"]).inc()

    def stream_ended(self, state: str | None, seconds: float) -> None:
        key = "deleted" if state is None else state if state in self._closes else "other"
        self._closes[key].observe(seconds)
