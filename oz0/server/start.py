"""Start a server: check everything that can be checked before any task runs, then run."""

from __future__ import annotations

import ipaddress
import logging
import resource
import secrets
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import trio

from oz0 import cluster as cluster_mod
from oz0 import membership, nodes, pki
from oz0.cluster import Cluster
from oz0.errors import Oz0Error
from oz0.jobs import pruner
from oz0.jobs.role import JobsRole
from oz0.jobs.secret_env import SecretKeeper
from oz0.server import edge, gc_tuning, loop_lag, management, ports_free, session_sweeper, tls
from oz0.server.api.common import ManagementState
from oz0.server.audit_follow import Followers
from oz0.server.certificates import ServerCertificates
from oz0.server.edge.tracking import RECONCILE_EVERY
from oz0.server.metrics import EdgeStreams, ServerMetrics, TemporalHost
from oz0.server.person_limits import PersonLimits
from oz0.server.readiness import Readiness
from oz0.server.session_relay import SessionRelay
from oz0.server.systemd_notify import Notifier
from oz0.store import databases, migrations
from oz0.store.dburl import DatabaseUrl
from oz0.store.events import EventHub
from oz0.store.pool import open_database
from oz0.temporal import host as temporal_host
from oz0.temporal import role as temporal_role
from oz0.temporal.host import TemporalStores, host_binary
from oz0.temporal.host_keeper import HostSettings
from oz0.web.live import Feed
from oz0_common import commands as process
from oz0_common.addresses import EDGE_PORT, MANAGEMENT_PORT, url_host

log = logging.getLogger(__name__)

# SIGINT/SIGTERM first drain the server (docs/run-a-cluster.md): requests in flight have
# this long from the signal to be answered and streamed nodes to move away; what is left
# then is cut, and each role's cleanup after that is bounded (about a second in all).
SHUTDOWN_GRACE = 4.0


@dataclass(frozen=True)
class StartOptions:
    url: DatabaseUrl
    master_key_file: Path
    advertise: str
    sans: tuple[str, ...] = ()
    listen: str | None = None
    # How often the edge checks that its streamed nodes are still accepted, in case a
    # notification was lost.
    reconcile_every: float = RECONCILE_EVERY
    # Nodes waiting for an operator, cluster-wide, beyond which tokenless joins are refused.
    max_pending_nodes: int = nodes.MAX_PENDING

    # Dev mode passes its advertise address: everything it runs stays on that address.
    listen_default: str = "0.0.0.0"
    # Dev mode's embedded PostgreSQL cannot hold Temporal's visibility schema.
    visibility_sqlite: Path | None = None
    # The organisation's certificate for the web UI (`--ui-cert/--ui-key`), else the UI CA's.
    ui_pair: tls.UiPair | None = None
    # What one person may hold or ask of this server (`--max-web-sessions-per-person`, ...).
    limits: PersonLimits = field(default_factory=PersonLimits)

    @property
    def listen_host(self) -> str:
        return self.listen or self.listen_default


@dataclass(frozen=True)
class Running:
    """What a started server tells whoever started it."""

    server_id: str
    cluster: Cluster
    management_url: str
    edge_address: str
    # Called once to stop: returns when the server has drained, or at SHUTDOWN_GRACE.
    drain: Callable[[], Awaitable[None]]


def check_advertise(advertise: str) -> str:
    try:
        return str(ipaddress.ip_address(advertise))
    except ValueError:
        raise Oz0Error(
            f"--advertise must be an IP address other servers and nodes reach this server on, "
            f"not {advertise!r} (add names with --san)"
        ) from None


def ui_pair(cert: Path | None, key: Path | None) -> tls.UiPair | None:
    """The organisation's web UI certificate and key, read and checked; None without them."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise Oz0Error("--ui-cert and --ui-key go together: give both, or neither")
    return tls.read_ui_pair(cert, key)


def prepare(options: StartOptions) -> Cluster:
    """Read the master key and unseal the cluster; raise before anything is written."""
    check_advertise(options.advertise)
    host_binary()
    _raise_open_file_limit()
    master_key = pki.read_master_key(options.master_key_file)
    with databases.connect(options.url.for_database(options.url.names.main)) as conn:
        databases.check_server_version(conn)
        _migrate(conn, options)
        # Committed when the connection closes; a wrong master key raises before any write.
        cluster_mod.reseal_legacy(conn, master_key)
        # Loaded first: a wrong master key must not seal a new UI CA's key.
        cluster = cluster_mod.load(conn, master_key)
        if cluster.ui_ca is not None:
            return cluster
        cluster_mod.ensure_ui_ca(conn, master_key, (options.advertise, *options.sans))
        return cluster_mod.load(conn, master_key)


def _migrate(conn: psycopg.Connection[Any], options: StartOptions) -> None:
    """Bring the database to this release's schema as far as the servers running beside
    this one allow, or refuse it (oz0/store/migrations.py has the rule)."""
    with conn.transaction():
        steps = migrations.apply(conn, membership.live_schemas)
    conn.commit()  # the migrations' lock is not held through the rest of the start
    if steps.apply:
        log.info("applied migrations %s", [m.version for m in steps.apply])
        # Ours and Temporal's go together, as `server init --upgrade` applies them.
        temporal_host.setup_schema(TemporalStores(options.url, options.visibility_sqlite))
    if steps.waiting:
        log.warning(
            "contract migrations %s wait until no server of an earlier schema is up; the "
            "next start (or `server init --upgrade`) with none up applies them",
            [m.version for m in steps.waiting],
        )


async def run_server(
    options: StartOptions,
    cluster: Cluster,
    *,
    task_status: trio.TaskStatus[Running] = trio.TASK_STATUS_IGNORED,
) -> None:
    # Before the database, membership and Temporal host start: said in a moment, not after
    # all of them have started and stopped again.
    ports_free.check(options.listen_host, (MANAGEMENT_PORT, EDGE_PORT))
    server_id = "server-" + secrets.token_hex(6)
    certs = ServerCertificates(
        cluster, server_id, sans=(options.advertise, *options.sans), ui_pair=options.ui_pair
    )
    host = options.listen_host
    advertised = url_host(options.advertise)
    conninfo = options.url.for_database(options.url.names.main)
    settings = HostSettings(
        stores=TemporalStores(options.url, options.visibility_sqlite),
        history_shards=cluster.history_shards,
        advertise=options.advertise,
        bind=host,
        cluster_name=cluster.name,
    )
    async with (
        open_database(conninfo) as db,
        # The membership heartbeat has a connection and a thread of its own: behind the
        # queries of thousands of nodes reconnecting at once, it would age past the limit
        # the other servers judge this one by.
        open_database(
            conninfo, min_size=1, max_size=1, name="oz0-membership", own_threads=True
        ) as beats,
        trio.open_nursery() as nursery,
    ):
        metrics = ServerMetrics(db)
        nursery.start_soon(loop_lag.watch, metrics.loop_lag)
        await nursery.start(
            partial(membership.run, beats, server_id, options.advertise, on_beat=metrics.heartbeat)
        )
        hub = EventHub(conninfo)
        await nursery.start(hub.run_forever)
        temporal = await nursery.start(temporal_role.run, db, hub, settings, certs, server_id)
        metrics.registry.register(TemporalHost(temporal.keeper))
        jobs = JobsRole(
            db, hub, lambda: temporal.frontend, server_id, ca=cluster.cluster_ca,
            keeper=SecretKeeper.of(cluster), on_ended=metrics.job_ended,
        )  # fmt: skip

        async def reconnect_jobs() -> None:
            jobs.renewed()

        async def run_jobs(*, task_status: trio.TaskStatus[None]) -> None:
            # The jobs role's client reconnects with each renewed certificate while it runs.
            with certs.told_of_renewals(reconnect_jobs):
                await jobs.run(task_status=task_status)

        await nursery.start(run_jobs)
        await nursery.start(partial(pruner.run, db, metrics.pruned, deleted=metrics.deleted))
        await nursery.start(session_sweeper.run, db, server_id)
        relay = SessionRelay()
        state = ManagementState(
            db=db,
            cluster=cluster,
            server_id=server_id,
            temporal=temporal,
            metrics=metrics,
            readiness=Readiness(db, metrics.heartbeat_age, lambda: temporal.keeper.state),
            kick_jobs=jobs.kick,
            in_namespace=jobs.in_namespace,
            hub=hub,
            limits=options.limits,
            sessions=relay,
            followers=Followers(per_person=options.limits.event_streams),
            live_pages=Feed(per_person=options.limits.live_pages),
        )
        management_tls = certs.management_context(tickets=management.TLS_TICKETS)
        served = await nursery.start(management.run, state, management_tls, host)
        streaming = await nursery.start(
            partial(
                edge.run,
                db,
                cluster,
                server_id,
                hub,
                certs.server_context(ssl.CERT_OPTIONAL, tickets=edge.TLS_TICKETS),
                host,
                advertise=options.advertise,
                reconcile_every=options.reconcile_every,
                max_pending=options.max_pending_nodes,
                metrics=metrics.edge,
                in_namespace=jobs.in_namespace,
                sessions=relay,
            )
        )
        metrics.registry.register(EdgeStreams(streaming.streams))
        nursery.start_soon(certs.renew_forever)
        gc_tuning.tune_after_start_up()

        async def drain() -> None:
            # Everything else (the database, Temporal, the jobs role's client and sweeper)
            # runs on meanwhile: the requests in flight need them. The job workers stop
            # now, while Temporal is still up under them (JobsRole.drain).
            requests, streams = served.requests, len(streaming.streams)
            log.info(
                "draining: %d request(s) in flight, %d node stream(s) told to move; "
                "whatever is left in %g s is cut",
                requests,
                streams,
                SHUTDOWN_GRACE,
            )
            began = trio.current_time()
            # What has not finished draining when the grace ends: named in the log, so
            # that a slow stop says what held it.
            unfinished: set[str] = set()

            async def part(name: str, drain_part: Callable[[], Awaitable[None]]) -> None:
                unfinished.add(name)
                await drain_part()
                unfinished.discard(name)

            with trio.move_on_after(SHUTDOWN_GRACE):
                async with trio.open_nursery() as draining:
                    draining.start_soon(
                        part, "management", partial(management.drain, state, served)
                    )
                    draining.start_soon(part, "edge", partial(edge.drain, streaming))
                    draining.start_soon(part, "job workers", jobs.drain)
            if unfinished:
                log.warning(
                    "the drain was cut after %g s; still draining: %s",
                    SHUTDOWN_GRACE,
                    ", ".join(sorted(unfinished)),
                )
            cut_requests, cut_streams = served.requests, len(streaming.streams)
            if cut_requests:
                # A request whose thread waits on the database (a lock held elsewhere)
                # would hold the stop until its statement ended.
                await db.cancel_running()
            log.info(
                "drained in %.2f s: %d request(s) and %d node stream(s) ended, "
                "%d request(s) and %d stream(s) cut",
                trio.current_time() - began,
                max(0, requests - cut_requests),
                max(0, streams - cut_streams),
                cut_requests,
                cut_streams,
            )

        task_status.started(
            Running(
                server_id=server_id,
                cluster=cluster,
                management_url=f"https://{advertised}:{MANAGEMENT_PORT}",
                edge_address=f"{advertised}:{EDGE_PORT}",
                drain=drain,
            )
        )


async def run_until_signalled(
    options: StartOptions,
    cluster: Cluster,
    on_started: Callable[[Running], None],
    notifier: Notifier | None = None,
) -> None:
    """Run the server until SIGINT or SIGTERM; then drain it (at most SHUTDOWN_GRACE) and
    stop every role.

    Under systemd (`Type=notify`, `server install-service`), NOTIFIER tells it READY=1 once
    the management API and the edge listen, and STOPPING=1 when the drain begins."""
    started: list[Running] = []
    systemd = notifier if notifier is not None else Notifier.from_env()

    async def start(root: trio.Nursery) -> None:
        running = await root.start(run_server, options, cluster)
        started.append(running)
        on_started(running)
        systemd.notify(
            "READY=1",
            f"STATUS=serving: management {running.management_url}, edge {running.edge_address}",
        )

    async def drain() -> None:
        systemd.notify("STOPPING=1", "STATUS=draining")
        for running in started:
            await running.drain()

    await process.run_until_signalled(start, drain=drain)


def _raise_open_file_limit() -> None:
    """Each node's control stream is a socket: allow as many as the hard limit does."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.debug("open file limit raised from %d to %d", soft, hard)
