"""The control stream: one websocket to `/control` at a time, kept up for as long as we run.

The node's certificate is its client certificate; the edge answers `welcome` or `refused`,
or, for a node being purged, a `purge` command (`commands.answer_purge`). After `welcome`
both sides send a heartbeat every `heartbeat` seconds; three intervals without anything
from the edge mean the stream is dead. Messages on a live stream go to
`commands.dispatch`. Whatever ends a stream, the reconnect policy picks the next edge.
"""

from __future__ import annotations

import logging
import random
import ssl
from typing import NoReturn

import trio

from oz0_node import purge
from oz0_node.commands import LiveStream, NodeRefused, answer_purge, dispatch, take_refusal
from oz0_node.errors import EdgeUnavailable, one_error
from oz0_node.messages import Hello, Refusal, Welcome, expect, kind
from oz0_node.node import Node
from oz0_node.reconnect import Reconnect
from oz0_node.transport import EdgeConnection, OpenStream, open_edge, open_tcp

log = logging.getLogger(__name__)

CONTROL_PATH = "/control"
WELCOME_TIMEOUT = 10.0
MISSED_HEARTBEATS = 3


async def run(
    node: Node,
    tls: ssl.SSLContext,
    ca_pem: bytes,
    *,
    open_stream: OpenStream = open_tcp,
    rng: random.Random | None = None,
) -> NoReturn:
    """Keep a control stream up, across every known edge, until cancelled or refused for good.

    Also ends by `PurgeConfirmed` once the node has answered a valid purge command.
    """
    policy = Reconnect(node.edges, rng=rng)
    nonces = purge.PurgeMemory.load(node.identity.data_dir)
    while True:
        address = await policy.next_edge()
        try:
            await _one_stream(node, address, tls, ca_pem, nonces, policy, open_stream)
        except NodeRefused as e:
            log.info("%s; trying again", e)
            policy.same_edge_again()
        except EdgeUnavailable as e:
            log.warning("%s; reconnecting", e)


async def _one_stream(
    node: Node,
    address: str,
    tls: ssl.SSLContext,
    ca_pem: bytes,
    nonces: purge.PurgeMemory,
    policy: Reconnect,
    open_stream: OpenStream,
) -> None:
    async with open_edge(
        address, CONTROL_PATH, tls, cluster=node.record.cluster, open_stream=open_stream
    ) as conn:
        hello = Hello.parse(await conn.receive(WELCOME_TIMEOUT), address)
        stream = LiveStream(node, conn, ca_pem, hello, nonces)
        answer = await conn.receive(WELCOME_TIMEOUT)
        while kind(answer) == "purge":
            # Refused (it returned): the edge goes on with `refused`, code `purging`.
            await answer_purge(stream, answer)
            answer = await conn.receive(WELCOME_TIMEOUT)
        if kind(answer) == "refused":
            raise take_refusal(node, Refusal.parse(answer, address), address)
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
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_send_heartbeats, conn, welcome.heartbeat)
                await _receive(stream, welcome.heartbeat)
        except BaseExceptionGroup as group:
            raise one_error(group) from None
        finally:
            node.stream_down()
            policy.stream_down()


async def _send_heartbeats(conn: EdgeConnection, interval: float) -> NoReturn:
    while True:
        await trio.sleep(interval)
        await conn.send("heartbeat")


async def _receive(stream: LiveStream, interval: float) -> NoReturn:
    """Dispatch what the edge sends; silence for three heartbeats ends the stream."""
    while True:
        message = await stream.conn.receive(MISSED_HEARTBEATS * interval)
        await dispatch(stream, message)
