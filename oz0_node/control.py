"""The control stream: one websocket to `/control` at a time, kept up for as long as we run.

The node's certificate is its client certificate; the edge answers `welcome` or `refused`,
or, for a node being purged, a `purge` command (`commands.answer_purge`). After `welcome`
both sides send a heartbeat every `heartbeat` seconds; three intervals without anything
from the edge mean the stream is dead. Messages on a live stream go to
`commands.dispatch`. While a stream is up, the node's certificate is renewed when due
(`renewal.py`; a renewal ends the stream, the next uses the new certificate) and the
node's runtime runs (`runtime.py`), in the frontend and namespace the welcome names, and
its plugins with it (`plugins.py`); both stop when the stream ends, whatever ends it. The
job attempts do not: they are the agent's (`jobs/manager.py`), and each stream is their
link to the cluster while it is up (`jobs.EdgeLink`: attached once welcomed, detached when
it ends), whose acks `commands.dispatch` hands back to them; a node blocked ends them.
Each stream first tells the edge how many attempts the node runs at once (`max_jobs`).
Whatever ends a stream, the reconnect policy picks the next edge; a `move` (the edge's
server is stopping) makes that another edge, at once.
"""

from __future__ import annotations

import logging
import os
import random
import ssl
from functools import partial
from typing import NoReturn

import trio

from oz0_common import certs
from oz0_common.attempt_messages import BY_STREAM, MAX_JOBS
from oz0_node import plugins, purge, renewal
from oz0_node.commands import LiveStream, NodeRefused, answer_purge, dispatch, take_refusal
from oz0_node.errors import EdgeLeaving, EdgeUnavailable, one_error
from oz0_node.jobs.attempt import node_secrets
from oz0_node.jobs.edge_link import EdgeLink
from oz0_node.jobs.grants import GrantCheck
from oz0_node.jobs.intake import Intake
from oz0_node.jobs.manager_port import ManagerPort
from oz0_node.messages import Hello, Refusal, Welcome, expect, kind
from oz0_node.node import Node
from oz0_node.reconnect import Reconnect
from oz0_node.runtime import (
    MAX_CONCURRENT_ACTIVITIES,
    RuntimeFailed,
    Runtimes,
    RuntimeSettings,
)
from oz0_node.sessions import NodeSessions
from oz0_node.tls import edge_context
from oz0_node.transport import EdgeConnection, OpenStream, open_edge, open_tcp

log = logging.getLogger(__name__)

CONTROL_PATH = "/control"
# Told once on each stream: how many attempts this node runs at once (`--max-jobs`), and
# that it takes attempts over the stream (jobs/intake.py).
WELCOME_TIMEOUT = 10.0
MISSED_HEARTBEATS = 3
# After a runtime failed to start (or its worker failed), on the same stream.
RUNTIME_RETRY_FIRST = 2.0
RUNTIME_RETRY_MAX = 60.0


async def run(
    node: Node,
    tls: ssl.SSLContext,
    ca_pem: bytes,
    *,
    open_stream: OpenStream = open_tcp,
    rng: random.Random | None = None,
    runtimes: Runtimes | None = None,
    clock: renewal.WallClock = certs.utcnow,
) -> NoReturn:
    """Keep a control stream up, across every known edge, until cancelled or refused for good.

    Also ends by `PurgeConfirmed` once the node has answered a valid purge command, and by
    AgentError once its certificate has expired. CLOCK tells when to renew it.
    """
    policy = Reconnect(node.edges, rng=rng)
    nonces = purge.PurgeMemory.load(node.identity.data_dir)
    runtimes = runtimes or Runtimes()
    while True:
        renewal.check_not_expired(node, clock())
        address = await policy.next_edge()
        try:
            await _one_stream(
                node, address, tls, ca_pem, nonces, policy, open_stream, runtimes, clock
            )
        except renewal.Renewed as e:
            log.info("%s", e)
            identity = node.identity
            tls = edge_context(ca_pem, cert_path=identity.cert_path, key_path=identity.key_path)
            policy.same_edge_again(refused=False)
        except NodeRefused as e:
            log.info("%s; trying again", e)
            if node.record.state == "blocked":
                # Its attempts were moved to other nodes when it was blocked.
                await runtimes.end_attempts("the node is blocked")
            policy.same_edge_again()
        except EdgeLeaving as e:
            log.info("%s; moving to another edge now", e)
            policy.move_now(address, e.towards)
        except EdgeUnavailable as e:
            log.warning("%s; reconnecting", e)
            policy.elsewhere()


async def _one_stream(
    node: Node,
    address: str,
    tls: ssl.SSLContext,
    ca_pem: bytes,
    nonces: purge.PurgeMemory,
    policy: Reconnect,
    open_stream: OpenStream,
    runtimes: Runtimes,
    clock: renewal.WallClock,
) -> None:
    async with open_edge(
        address, CONTROL_PATH, tls, cluster=node.record.cluster, open_stream=open_stream
    ) as conn:
        hello = Hello.parse(await conn.receive(WELCOME_TIMEOUT), address)
        manager = runtimes.manager
        link = manager.link if manager is not None else EdgeLink()
        intake = _intake(node, runtimes)
        sessions = (
            NodeSessions(
                node.record.node_id,
                conn,
                node.isolation,
                lambda: intake.grants if intake is not None else None,
                launcher=runtimes.manager.launcher if runtimes.manager is not None else None,
                users=node.session_users,
            )
            if node.record.node_id is not None
            else None
        )
        stream = LiveStream(node, conn, ca_pem, hello, nonces, link, manager, intake, sessions)
        answer = await conn.receive(WELCOME_TIMEOUT)
        while kind(answer) == "purge":
            # Refused (it returned): the edge goes on with `refused`, code `purging`.
            await answer_purge(stream, answer)
            answer = await conn.receive(WELCOME_TIMEOUT)
        if kind(answer) == "refused":
            refusal = Refusal.parse(answer, address)
            if refusal.code == "unknown" and await renewal.pick_up_lost_renewal(
                node, ca_pem, address, open_stream
            ):
                raise renewal.Renewed(f"node {node.name} completed a renewal; reconnecting")
            raise take_refusal(node, refusal, address)
        welcome = Welcome.parse(expect(answer, "welcome", address), address)
        if welcome.node_id != node.record.node_id:
            log.warning(
                "edge %s welcomed node %s, but this is node %s",
                address,
                welcome.node_id,
                node.record.node_id,
            )
        node.remember(state="accepted", edges=welcome.edges)
        node.stream_up(welcome.server)
        policy.stream_up()
        log.info(
            "control stream up: edge %s, server %s, heartbeat every %g s",
            address,
            welcome.server,
            welcome.heartbeat,
        )
        link.attach(conn)
        try:
            if manager is not None:
                if intake is not None and welcome.tenant is not None:
                    assert node.record.node_id is not None
                    intake.grants = GrantCheck(
                        cluster=node.record.cluster,
                        tenant=welcome.tenant,
                        node_id=node.record.node_id,
                        ca=certs.cert_from_pem(ca_pem),
                        record=manager.run_record(node.identity.data_dir),
                    )
                    # Placement puts no more attempts on this node than it runs at once,
                    # and sends them over this stream.
                    await conn.send(MAX_JOBS, max_jobs=manager.max_running, attempts=BY_STREAM)
                else:
                    await conn.send(MAX_JOBS, max_jobs=manager.max_running)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_heartbeats, conn, welcome.heartbeat)
                nursery.start_soon(_keep_runtime, node, welcome, address, runtimes)
                nursery.start_soon(renewal.keep_fresh, stream, clock)
                if sessions is not None:
                    nursery.start_soon(sessions.run)
                await _receive(stream, welcome.heartbeat)
        except BaseExceptionGroup as group:
            raise one_error(group) from None
        finally:
            link.detach(conn)
            node.stream_down()
            policy.stream_down()


def _intake(node: Node, runtimes: Runtimes) -> Intake | None:
    """The agent's intake of attempts sent over its streams (one for all of them, made
    with its manager's first stream): None without a manager."""
    manager = runtimes.manager
    node_id = node.record.node_id
    if manager is None or node_id is None:
        return None
    if runtimes.intake is None:
        runtimes.intake = Intake(manager, node_id, node_secrets(node.identity, node_id))
    return runtimes.intake


async def _keep_runtime(node: Node, welcome: Welcome, address: str, runtimes: Runtimes) -> None:
    """Run the node's runtime for as long as the stream is up; a failure is retried on it.

    It hands the attempts it takes to the agent's attempt manager."""
    if welcome.temporal is None or welcome.tenant is None:
        log.warning(
            "edge %s named no Temporal frontend or tenant (an older server?): "
            "node %s runs no runtime on this stream",
            address,
            node.name,
        )
        return
    assert node.record.node_id is not None  # a control stream needs the node's certificate
    settings = RuntimeSettings(
        node_id=node.record.node_id,  # the name its certificate, and so Temporal, knows
        namespace=welcome.tenant,
        temporal=welcome.temporal,
        identity=node.identity,
        cluster=node.record.cluster,
        attempts=(ManagerPort(runtimes.manager) if runtimes.manager is not None else None),
        record=(
            runtimes.manager.run_record(node.identity.data_dir)
            if runtimes.manager is not None
            else None
        ),
        max_activities=(
            runtimes.manager.max_running
            if runtimes.manager is not None
            else MAX_CONCURRENT_ACTIVITIES
        ),
    )
    async with trio.open_nursery() as nursery:
        # Plugins run alongside the runtime: whatever ends this stream stops both.
        nursery.start_soon(
            partial(
                plugins.run_all,
                plugins.PluginSettings(node.identity.data_dir, settings.node_id, os.environ),
                launch=runtimes.launch_plugin,
            )
        )
        await _retry_runtime(node, settings, runtimes)


async def _retry_runtime(node: Node, settings: RuntimeSettings, runtimes: Runtimes) -> NoReturn:
    delay = RUNTIME_RETRY_FIRST
    while True:
        try:
            await runtimes.run(settings, lambda: node.runtime_changed("running"))
        except RuntimeFailed as e:
            log.warning("%s; trying again in %g s", e, delay)
        finally:
            node.runtime_changed("stopped")
        await trio.sleep(delay)
        delay = min(2 * delay, RUNTIME_RETRY_MAX)


async def _send_heartbeats(conn: EdgeConnection, interval: float) -> NoReturn:
    while True:
        await trio.sleep(interval)
        await conn.send("heartbeat")


async def _receive(stream: LiveStream, interval: float) -> NoReturn:
    """Dispatch what the edge sends; silence for three heartbeats ends the stream."""
    while True:
        message = await stream.conn.receive(MISSED_HEARTBEATS * interval)
        await dispatch(stream, message)
