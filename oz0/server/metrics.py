"""The server's Prometheus metrics (`GET /metrics` on 8443; docs/run-a-cluster.md lists them).

One registry per server, never prometheus_client's global one, so several servers (or
tests) in one process keep theirs apart. Roles record events into it as they happen
(`EdgeMetrics`, the event-loop lag); what is a state rather than an event (streams open,
the pool, Temporal's host, the heartbeat's age) is read when scraped, by `_ReadAtScrape`
(and, for roles that start after the registry, `TemporalHost` and `EdgeStreams`, each
registered once its role runs), so recording it costs nothing between scrapes. The
cluster's counts (nodes, servers up, jobs not ended: cluster_counts.py) come from
PostgreSQL, at most once every cluster_counts.MAX_AGE however often anyone scrapes; the
text itself is made at most once every EXPOSITION_MAX_AGE (it takes milliseconds of the
Trio thread), so a storm of scrapes costs little more than a storm of `/healthz`.

No label holds an ID (of a node, a token, a server): only states and reasons, a few
values each. The endpoint needs no sign-in, so it names no tenant either (who the cluster
serves is not for strangers): the node counts by tenant (`oz0_tenant_nodes`) are added
only for a current operator certificate, and only the tenants that operator reaches
(`tenant_exposition`).
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Iterable, Sized

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Info,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.registry import Collector

from oz0 import __version__, nodes
from oz0.jobs.pruner import Pruned
from oz0.jobs.spec import ENDED_STATES
from oz0.jobs.store import JobTimes
from oz0.server import cluster_counts
from oz0.server.cluster_counts import LIVE_JOB_STATES, ClusterCounts
from oz0.server.edge.metrics import EdgeMetrics
from oz0.store.pool import Database
from oz0.temporal.host_keeper import HOST_STATES, HostKeeper

log = logging.getLogger(__name__)

EXPOSITION_MAX_AGE = 1.0
LAG_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A job's time, from a command of a second to one of hours (timeouts go to days).
JOB_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)
# The caps on one person (oz0/server/person_limits.py) a refusal names.
PERSON_CAPS = ("requests", "web_sessions", "live_pages")


class ServerMetrics:
    """The registry of one server and what its roles record into it."""

    def __init__(self, db: Database) -> None:
        # A `_created` series per counter and histogram is a tenth of the text and of its
        # cost, and Prometheus needs none. (A setting of the library, for the process: the
        # server is its one user there.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry()
        self._text = b""
        self._text_at: float | None = None
        self.db = db
        self.cluster_counts = ClusterCounts(db)
        self.edge = EdgeMetrics(self.registry)
        self._last_beat: float | None = None

        ProcessCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        Info("oz0_build", "The server's version.", registry=self.registry).info(
            {"version": __version__}
        )
        self.management_over_limit = Counter(
            "oz0_management_connections_over_limit",
            "New connections this server's management API closed at once, before TLS, as"
            " their source address already held 64 unauthenticated ones or the API 2,048.",
            registry=self.registry,
        )
        self._lag = Histogram(
            "oz0_event_loop_lag_seconds",
            "How late the server's Trio thread woke a task that slept 0.5 s.",
            buckets=LAG_BUCKETS,
            registry=self.registry,
        )
        self._last_lag = Gauge(
            "oz0_event_loop_lag_last_seconds",
            "The latest of oz0_event_loop_lag_seconds.",
            registry=self.registry,
        )
        self._prune_passes = Counter(
            "oz0_prune_passes",
            "Pruning passes this server made (one server of the cluster prunes at a time).",
            registry=self.registry,
        )
        # No labels: each is its own counter (a label names only states and reasons).
        self._pruned = {
            what: Counter(
                f"oz0_pruned_{what}",
                f"{doc} this server's pruning passes deleted.",
                registry=self.registry,
            )
            for what, doc in (
                ("jobs", "Finished jobs past their tenant's retention"),
                ("attempts", "Attempts of those jobs"),
                ("output_rows", "Output rows of those jobs"),
                ("audit_rows", "Audit rows past the audit retention"),
                ("files", "Stored files that nothing names any more"),
            )
        }
        jobs_ended = Histogram(
            "oz0_job_duration_seconds",
            "From a job's creation to its end, by how it ended; counted by the server whose"
            " job worker ended it.",
            ["state"],
            buckets=JOB_BUCKETS,
            registry=self.registry,
        )
        jobs_waited = Histogram(
            "oz0_job_wait_seconds",
            "From a job's creation to its first attempt placed, of the jobs that ran, by how"
            " they ended; observed as the job ends, by the server that ended it.",
            ["state"],
            buckets=JOB_BUCKETS,
            registry=self.registry,
        )
        # Children made in advance: every series is there (at 0) before its first event.
        self._jobs_ended = {state: jobs_ended.labels(state) for state in ENDED_STATES}
        self._jobs_waited = {state: jobs_waited.labels(state) for state in ENDED_STATES}
        caps_hit = Counter(
            "oz0_person_caps_hit",
            "Requests this server refused as their person was past a cap (server start"
            " --max-web-sessions-per-person, --max-live-pages-per-person,"
            " --person-requests-per-second), by cap.",
            ["cap"],
            registry=self.registry,
        )
        self._caps_hit = {cap: caps_hit.labels(cap) for cap in PERSON_CAPS}
        self.registry.register(_ReadAtScrape(self))

    def job_ended(self, state: str, times: JobTimes) -> None:
        """A job worker of this server ended a job just now (any thread: the worker's)."""
        ended = self._jobs_ended.get(state)
        if ended is None:
            return
        ended.observe(times.total)
        if times.waited is not None:
            self._jobs_waited[state].observe(times.waited)

    def person_cap_hit(self, cap: str) -> None:
        """A request was refused just now, its person past CAP (PERSON_CAPS)."""
        self._caps_hit[cap].inc()

    def pruned(self, done: Pruned) -> None:
        """A pruning pass of this server's ended (what it deleted was counted as it went:
        `deleted`)."""
        self._prune_passes.inc()

    def deleted(self, batch: Pruned) -> None:
        """A batch of a pruning pass was deleted just now."""
        for what, counter in self._pruned.items():
            counter.inc(getattr(batch, what))

    def loop_lag(self, seconds: float) -> None:
        self._lag.observe(seconds)
        self._last_lag.set(seconds)

    def heartbeat(self) -> None:
        """This server's membership row was written just now."""
        self._last_beat = trio.current_time()

    def heartbeat_age(self) -> float | None:
        """Seconds since this server's membership row was last written; None before."""
        return None if self._last_beat is None else trio.current_time() - self._last_beat

    async def exposition(self) -> bytes:
        """The text a scrape gets; called in the Trio thread (it reads Trio's state)."""
        if self._text_at is None or trio.current_time() - self._text_at >= EXPOSITION_MAX_AGE:
            await self.cluster_counts.fresh()
            self._text = generate_latest(self.registry)
            self._text_at = trio.current_time()
        return self._text

    def tenant_exposition(self, reaches: Callable[[str], bool]) -> bytes:
        """The node counts by tenant, for the tenants REACHES takes: added to `exposition`
        for an operator's certificate. Made from the counts `exposition` just read."""
        return generate_latest(_TenantNodes(self.cluster_counts, reaches))


class _ReadAtScrape(Collector):
    def __init__(self, metrics: ServerMetrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        m = self._metrics
        yield from self._cluster()
        use = m.db.use()
        yield _gauge("oz0_db_pool_in_use", "Pooled database connections in use.", use.in_use)
        yield _gauge("oz0_db_pool_size", "Database connections the pool holds.", use.size)
        yield _gauge(
            "oz0_db_pool_max_size", "Database connections the pool may hold.", use.max_size
        )
        yield _gauge(
            "oz0_db_pool_waiting", "Queries waiting for a pooled database connection.", use.waiting
        )
        # Every query runs in one of Trio's worker threads, which are limited too.
        limiter = trio.to_thread.current_default_thread_limiter()
        yield _gauge(
            "oz0_worker_threads_in_use",
            "Trio worker threads running database queries and other blocking calls.",
            limiter.borrowed_tokens,
        )
        yield _gauge(
            "oz0_worker_threads_waiting",
            "Calls waiting for a Trio worker thread.",
            limiter.statistics().tasks_waiting,
        )
        age = m.heartbeat_age()
        if age is not None:
            yield _gauge(
                "oz0_membership_heartbeat_age_seconds",
                "Seconds since this server last wrote its membership row.",
                age,
            )

    def _cluster(self) -> Iterable[Metric]:
        counts = self._metrics.cluster_counts
        if counts.read_at is None:
            return
        counted = counts.counted
        family = GaugeMetricFamily(
            "oz0_nodes",
            f"Nodes of the cluster by state (all tenants), read at most every"
            f" {cluster_counts.MAX_AGE:g} s.",
            labels=["state"],
        )
        by_state = collections.Counter[str]()
        for (_, state), n in counted.nodes.items():
            by_state[state] += n
        # Every state, zeros too, so a series never vanishes.
        for state in nodes.STATES:
            family.add_metric([state], by_state[state])
        yield family
        yield _gauge(
            "oz0_nodes_age_seconds",
            "How old the counts of oz0_nodes (and oz0_servers_up, oz0_jobs) are.",
            trio.current_time() - counts.read_at,
        )
        yield _gauge(
            "oz0_servers_up",
            "Servers of the cluster up (a membership heartbeat younger than 5 s), as this"
            " server reads the membership table.",
            counted.servers_up,
        )
        jobs = GaugeMetricFamily(
            "oz0_jobs",
            "Jobs of the cluster not ended, by state (all tenants).",
            labels=["state"],
        )
        for state in LIVE_JOB_STATES:
            jobs.add_metric([state], counted.jobs.get(state, 0))
        yield jobs
        yield _gauge(
            "oz0_jobs_oldest_queued_seconds",
            "How long the oldest job still queued has been (0: none is).",
            counted.oldest_queued,
        )
        yield _gauge(
            "oz0_jobs_oldest_unstarted_seconds",
            "How long the oldest job whose workflow no server has started yet has been (0:"
            " none); the servers' sweepers start each within a second.",
            counted.oldest_unstarted,
        )


class TemporalHost(Collector):
    """The state of this server's Temporal host, read from SUPERVISOR at each scrape:
    registered once the temporal role runs (start.py), so it always has one."""

    def __init__(self, keeper: HostKeeper) -> None:
        self._keeper = keeper

    def collect(self) -> Iterable[Metric]:
        state = GaugeMetricFamily(
            "oz0_temporal_host_state",
            "1 for the state this server's Temporal host is in, 0 for the others.",
            labels=["state"],
        )
        for name in HOST_STATES:
            state.add_metric([name], 1.0 if self._keeper.state == name else 0.0)
        yield state
        yield CounterMetricFamily(
            "oz0_temporal_host_restarts",
            "Times this server's Temporal host stopped after serving and was started again.",
            value=self._keeper.restarts,
        )


class EdgeStreams(Collector):
    """The control streams open on this server's edge (STREAMS: its reconciler, which
    counts them), read at each scrape: registered once the edge runs (start.py)."""

    def __init__(self, streams: Sized) -> None:
        self._streams = streams

    def collect(self) -> Iterable[Metric]:
        yield _gauge(
            "oz0_edge_streams_open",
            "Control streams of nodes open on this server.",
            len(self._streams),
        )


class _TenantNodes(Collector):
    """The node counts by tenant, of the tenants REACHES takes."""

    def __init__(self, counts: ClusterCounts, reaches: Callable[[str], bool]) -> None:
        self._counts = counts
        self._reaches = reaches

    def collect(self) -> Iterable[Metric]:
        counts = self._counts.counted.nodes
        if self._counts.read_at is None:
            return
        family = GaugeMetricFamily(
            "oz0_tenant_nodes",
            "Nodes of each tenant by state, as oz0_nodes (shown to an operator certificate"
            " only, for the tenants it reaches).",
            labels=["tenant", "state"],
        )
        # Every state of every tenant seen, zeros too, so a series never vanishes.
        for tenant in sorted({tenant for tenant, _ in counts if self._reaches(tenant)}):
            for state in nodes.STATES:
                family.add_metric([tenant, state], counts.get((tenant, state), 0))
        yield family


def _gauge(name: str, documentation: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, value=value)
