"""`oz0-node start`: from what DIR remembers (or the command line), join and stay connected.

One `trio.run`, one root nursery: the agent is one task in it, the signal watcher the
other. SIGINT or SIGTERM cancel the nursery; on the way out status.json says the node is
no longer connected. The one way the agent ends by itself is a purge: after confirming a
valid purge command it stops what it runs, deletes its data directory and its launcher,
and returns `Purged` (from then on it writes nothing, so nothing recreates the directory).
"""

from __future__ import annotations

import logging
import os
import random
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import trio
from cryptography.hazmat.primitives.asymmetric import ec

from oz0_common import certs
from oz0_common import commands as process
from oz0_common.asyncio_portal import TrioPortal
from oz0_node import control, join, purge, renewal
from oz0_node.errors import AgentError
from oz0_node.identity import DEFAULT_MAX_JOBS, IdentityDir, NodeRecord
from oz0_node.jobs import session_client, supervisor_client
from oz0_node.jobs.attempt_uids import UidRange
from oz0_node.jobs.file_push import PushPolicy
from oz0_node.jobs.isolation import Isolation
from oz0_node.jobs.job_user import check_private
from oz0_node.jobs.manager import STOP_WITHIN, AttemptManager
from oz0_node.node import Node
from oz0_node.runtime import NodeRuntime, RuntimeFactory, Runtimes
from oz0_node.tls import edge_context
from oz0_node.transport import OpenStream, open_tcp

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StartOptions:
    data_dir: Path
    edges: list[str] = field(default_factory=list)
    ca_hash: str | None = None
    request: join.JoinRequest = field(default_factory=join.JoinRequest)
    # Given: remembered in node.json. Else what node.json remembers, else the default.
    launcher: Path | None = None
    default_launcher: Path | None = None
    # The user jobs run as (--job-user); None: for an agent running as root, each attempt
    # a UID of its own from JOB_UIDS (--job-uids; None: the default range).
    job_user: str | None = None
    job_uids: UidRange | None = None
    # How many attempts run at once (--max-jobs). Given: remembered in node.json. Else
    # what node.json remembers, else DEFAULT_MAX_JOBS.
    max_jobs: int | None = None
    # Where `file push` may write besides DATA_DIR/files (--push-dir), and whether a file
    # may be root's (--push-root-owned): jobs/file_push.py.
    push_dirs: tuple[Path, ...] = ()
    push_root_owned: bool = False
    # The accounts sessions may run as besides their own UIDs (--session-users).
    session_users: frozenset[str] = frozenset()


def check_options(record: NodeRecord | None, options: StartOptions) -> None:
    """Refuse what DIR and the command line cannot both mean; before anything is written."""
    if record is None:
        missing = [
            flag
            for flag, given in (("--edge", options.edges), ("--ca-hash", options.ca_hash))
            if not given
        ]
        if missing:
            raise AgentError(
                f"{options.data_dir} holds no node identity; to join a cluster, "
                f"give {' and '.join(missing)}"
            )
        return
    if options.ca_hash is not None and options.ca_hash != record.ca_hash:
        raise AgentError(
            f"{options.data_dir} belongs to cluster {record.cluster} (CA {record.ca_hash}), "
            f"not to --ca-hash {options.ca_hash}"
        )


async def run(
    options: StartOptions,
    *,
    open_stream: OpenStream = open_tcp,
    rng: random.Random | None = None,
    runtime_factory: RuntimeFactory | None = None,
    clock: renewal.WallClock = certs.utcnow,
) -> purge.Purged:
    """Join if needed, then keep a control stream up; returns only once purged.

    RUNTIME_FACTORY makes the node's runtime for each stream (tests pass fakes); CLOCK
    tells when the node certificate is due for renewal (tests run it on Trio's clock)."""
    identity = IdentityDir(options.data_dir)
    identity.migrate_flat_layout()
    check_options(identity.load_record(), options)
    identity.ensure_data_dir()
    with identity.locked():
        identity.finish_renewal()
        record = identity.load_record()
        # Before anything reaches the network: an agent that could run no job safely
        # stops here, and a crash's leftovers are ended before new attempts come.
        isolation = prepare_jobs(options, identity, record.node_id if record else None)
        if (record is None or record.node_id is None) and identity.has_certificate():
            # Joining again would pair a fresh record with the old node's certificate.
            raise AgentError(
                f"{options.data_dir} holds a node certificate but no node record "
                f"({identity.record_path.name} is missing or names no node); it is damaged: "
                f"move it away and join with a new --data-dir"
            )
        if record is None:
            assert options.ca_hash is not None  # check_options
            pinned = await join.pin_ca(
                options.edges, options.ca_hash, open_stream=open_stream, rng=rng
            )
            identity.create()
            identity.save_ca(pinned.ca_pem)
            record = NodeRecord(cluster=pinned.cluster, ca_hash=pinned.ca_hash)
            identity.save_record(record)
        node = Node(identity, record)
        node.isolation = isolation
        node.session_users = options.session_users
        node.remember(
            edges=options.edges,
            launcher=str(options.launcher) if options.launcher is not None else None,
            max_jobs=options.max_jobs,
        )
        if record.node_id is not None and _ignored_join_options(options):
            log.warning(
                "node %s has joined already; the join token and --label are ignored", node.name
            )
        if record.state == "rejected" and not identity.has_certificate():
            raise AgentError(f"node {node.name} was rejected; to join again, use a new --data-dir")
        key = identity.load_or_create_key()
        ca_pem = identity.load_ca_pem()
        node.publish()
        async with trio.open_nursery() as nursery:
            # The attempts are the agent's: they outlive every stream, and the supervisors
            # they run under outlive the agent itself (a restart re-attaches them here).
            manager = AttemptManager(
                options.data_dir, isolation, max_running=node.record.max_jobs or DEFAULT_MAX_JOBS
            )
            manager.pushes = PushPolicy.of(
                options.data_dir, options.push_dirs, options.push_root_owned
            )
            await nursery.start(manager.run)
            # Read now: an unreadable one is said at the start (log, status.json), and its
            # repair is said as soon as an attempt finds it (from either thread).
            node.run_record = manager.run_record(options.data_dir)
            node.run_record.on_change = partial(TrioPortal("oz0-agent").call_soon, node.publish)
            if node.run_record.unusable is not None:
                node.publish()
            runtimes = Runtimes(
                runtime_factory if runtime_factory is not None else NodeRuntime,
                manager=manager,
            )
            failed: AgentError | None = None
            try:
                command = await _stay_connected(
                    node, key, ca_pem, options.request, open_stream, rng, runtimes, clock
                )
                purged = await _carry_out_purge(node, command, options, runtimes)
            except AgentError as e:
                # Rejected, deleted, expired: no cluster will take this node's reports.
                await runtimes.end_attempts("the node can no longer reach its cluster")
                failed = e  # raised as itself, not in the nursery's exception group
            nursery.cancel_scope.cancel()
        if failed is not None:
            raise failed
        return purged


def prepare_jobs(options: StartOptions, identity: IdentityDir, node_id: str | None) -> Isolation:
    """How this agent will run jobs (jobs/isolation.py), checked before it connects: the job
    user exists, DIR and DIR/identity are the agent's alone; then what a previous agent
    process left running (killed with -9, crashed) is ended. AgentError when no job could
    run safely."""
    # supervised: the attempts' supervisors follow their commands; the agent is no
    # subreaper (it would adopt every supervisor it started, and never reap them).
    isolation = Isolation.detect(
        options.data_dir, options.job_user, supervised=True, job_uids=options.job_uids
    )
    root = os.geteuid() == 0
    # Root: closed here (0700). An agent whose jobs run as itself refuses instead: it
    # cannot tell who opened them, nor why.
    check_private([options.data_dir, identity.root], enforce=root)
    if root and isolation.user is not None and isolation.user.uid == 0:
        log.warning(
            "jobs run as root (--job-user %s): a job can read this node's identity and "
            "change its agent",
            isolation.user.name,
        )
    # Each attempt's own UID: nothing on the machine may use the range (one line if
    # something does), and what dead supervisors' attempts left of theirs is swept.
    isolation.prepare_uids()
    described = isolation.describe(node_id)
    log.info("jobs run as %s, tracked by %s", described["job_user"], described["tracking"])
    # Sessions are the agent's: none outlives it (their cgroups first, as theirs).
    session_client.end_left(options.data_dir)
    isolation.end_leftovers(node_id)
    return isolation


async def _stay_connected(
    node: Node,
    key: ec.EllipticCurvePrivateKey,
    ca_pem: bytes,
    request: join.JoinRequest,
    open_stream: OpenStream,
    rng: random.Random | None,
    runtimes: Runtimes,
    clock: renewal.WallClock,
) -> purge.PurgeCommand:
    """Get the certificate if needed, then the control stream; the purge that ended it.

    On the way out status.json says the node is no longer connected; for a purged node that
    is the last write into DIR, which is deleted after this returns.
    """
    identity = node.identity
    try:
        if not identity.has_certificate():
            await join.obtain_certificate(
                node, key, request, edge_context(ca_pem), ca_pem, open_stream=open_stream, rng=rng
            )
        tls = edge_context(ca_pem, cert_path=identity.cert_path, key_path=identity.key_path)
        await control.run(
            node, tls, ca_pem, open_stream=open_stream, rng=rng, runtimes=runtimes, clock=clock
        )
    except purge.PurgeConfirmed as confirmed:
        return confirmed.command
    finally:
        node.stream_down()
        node.publish()


async def _carry_out_purge(
    node: Node, command: purge.PurgeCommand, options: StartOptions, runtimes: Runtimes
) -> purge.Purged:
    """Stop everything, then delete DIR and the launcher; still holding DIR's lock."""
    await _stop_runtimes_and_plugins(runtimes, node.identity.data_dir)
    remembered = node.record.launcher
    launcher = Path(remembered) if remembered is not None else options.default_launcher
    data_dir = node.identity.data_dir
    made_above = node.identity.created_parents()
    purge.delete_data_dir(data_dir, command.node_id)
    purge.remove_empty(made_above)
    deleted_launcher = purge.delete_launcher(launcher)
    log.info("node %s purged: deleted %s", command.node_id, data_dir)
    return purge.Purged(node_id=command.node_id, data_dir=data_dir, launcher=deleted_launcher)


async def _stop_runtimes_and_plugins(runtimes: Runtimes, data_dir: Path) -> None:
    """The one place where a purge stops the node's runtimes, attempts and plugins, before
    their files go, each within a time limit. The runtime and the plugins of the stream that
    delivered the purge stopped with that stream (plugins run in its nursery, so none can
    outlive it); this stops whatever runtime still runs, then every attempt's supervisor
    (and what a dead one left), so nothing of a job is left on the machine.
    """
    await runtimes.stop_all()
    await runtimes.end_attempts("the node is purged")
    if supervisor_client.find_all(data_dir):  # what a dead supervisor left, and any stragglers
        await trio.to_thread.run_sync(supervisor_client.stop_all, data_dir, STOP_WITHIN)


def _ignored_join_options(options: StartOptions) -> bool:
    return options.request.token is not None or bool(options.request.labels)


async def run_until_signalled(options: StartOptions) -> purge.Purged | None:
    """The process's root: the agent until it fails or is purged, or until SIGINT/SIGTERM."""
    outcome: list[purge.Purged] = []

    async def start(root: trio.Nursery) -> None:
        root.start_soon(_run_then_stop, options, root.cancel_scope, outcome)

    await process.run_until_signalled(start)
    return outcome[0] if outcome else None


async def _run_then_stop(
    options: StartOptions, scope: trio.CancelScope, outcome: list[purge.Purged]
) -> None:
    outcome.append(await run(options))
    scope.cancel()
