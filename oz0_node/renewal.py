"""Keeping the node certificate valid: renewed over the control stream before it expires.

On every control stream, once NODE_RENEW_AT (two thirds) of the certificate's validity has
passed, the agent makes a new key (DIR/identity/node.key.next, 0600) and sends `renew`
with a CSR signed by it; it asks again on every later stream, and every RETRY_ON_STREAM
on a stream that lasts, until it has a new certificate. The edge answers `renewed` with
a certificate for the new key, which the agent checks against the pinned CA and installs
with the key (identity.py: key, then certificate), then it ends the stream: the next one,
and the node's runtime on it, use the new pair. Or `renew_refused`, which is logged.

The edge swaps the key in the cluster before it answers; if the answer is lost, the old
certificate is refused as `unknown` from then on. The agent then proves the next key on
`/join` (a pickup) and takes the certificate the cluster holds for it.

A certificate that expired cannot be renewed: the agent stops, saying what to do.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from oz0_common import certs
from oz0_node import join, status
from oz0_node.errors import AgentError, EdgeUnavailable, ProtocolViolation
from oz0_node.messages import Joined, Message, Refusal, kind, text
from oz0_node.node import Node
from oz0_node.tls import edge_context
from oz0_node.transport import OpenStream, open_edge

if TYPE_CHECKING:
    from oz0_node.commands import LiveStream

log = logging.getLogger(__name__)

WallClock = Callable[[], dt.datetime]
# Asked again on a stream that stays up (after a refusal, or an edge that did not answer).
RETRY_ON_STREAM = 3600.0
# The wall clock is read again at least this often: a machine may sleep, its clock jump.
MAX_SLEEP = 3600.0


class Renewed(EdgeUnavailable):
    """The node has a new certificate: end this stream, connect again with it."""


def renew_from(cert: x509.Certificate) -> dt.datetime:
    """When the agent starts asking for a new certificate."""
    return certs.renewal_point(cert, certs.NODE_RENEW_AT)


def check_not_expired(node: Node, now: dt.datetime) -> None:
    """AgentError, logged, if the node certificate has expired at NOW."""
    if not node.identity.has_certificate():
        return
    cert = node.identity.load_certificate()
    if now >= cert.not_valid_after_utc:
        message = status.expired_message(
            node.name, node.identity.data_dir, cert.not_valid_after_utc
        )
        log.error("%s", message)
        raise AgentError(message)


async def keep_fresh(stream: LiveStream, clock: WallClock) -> NoReturn:
    """For as long as the stream is up: ask for a new certificate once it is due."""
    identity = stream.node.identity
    while True:
        cert = identity.load_certificate()
        wait = (renew_from(cert) - clock()).total_seconds()
        if wait > 0:
            await trio.sleep(min(wait, MAX_SLEEP))
            continue
        await request(stream, cert)
        await trio.sleep(RETRY_ON_STREAM)


async def request(stream: LiveStream, cert: x509.Certificate) -> None:
    node = stream.node
    assert node.record.node_id is not None  # a control stream needs the node's certificate
    key = node.identity.next_key()
    csr = certs.make_csr(key, node.record.node_id).public_bytes(serialization.Encoding.PEM)
    log.info(
        "asking edge %s for a new certificate of node %s (this one is valid until %s)",
        stream.conn.address,
        node.name,
        cert.not_valid_after_utc.isoformat(),
    )
    await stream.conn.send("renew", csr=csr.decode())


async def on_renewed(stream: LiveStream, message: Message) -> None:
    """`renewed`: install the certificate with the next key, then end the stream."""
    node, address = stream.node, stream.conn.address
    assert node.record.node_id is not None
    if not node.identity.has_next_key():
        raise ProtocolViolation(f"edge {address} sent a certificate the node did not ask for")
    key = node.identity.load_next_key()
    pem = text(message, "certificate", address)
    cert = join.check_certificate(pem, key, node.record.node_id, stream.ca_pem, address)
    node.identity.install_renewal(cert)
    raise Renewed(
        f"node {node.name} has a new certificate, valid until "
        f"{cert.not_valid_after_utc.isoformat()}; reconnecting with it"
    )


async def on_renew_refused(stream: LiveStream, message: Message) -> None:
    address = stream.conn.address
    refusal = Refusal.parse(message, address)
    log.warning(
        "edge %s did not renew the certificate of node %s (%s: %s); asking again on the "
        "next stream, or in %g s",
        address,
        stream.node.name,
        refusal.code,
        refusal.message,
        RETRY_ON_STREAM,
    )


async def pick_up_lost_renewal(
    node: Node,
    ca_pem: bytes,
    address: str,
    open_stream: OpenStream,
) -> bool:
    """Whether the cluster holds a certificate for the next key (a renewal whose answer was
    lost), now installed. Asked of ADDRESS after it refused the current one as unknown."""
    identity = node.identity
    node_id = node.record.node_id
    if node_id is None or not identity.has_next_key():
        return False
    key = identity.load_next_key()
    try:
        async with open_edge(
            address,
            join.JOIN_PATH,
            edge_context(ca_pem),
            cluster=node.record.cluster,
            open_stream=open_stream,
        ) as conn:
            answer = await join.pickup(conn, key, node_id)
        if kind(answer) != "joined":
            return False
        joined = Joined.parse(answer, address)
        if joined.state != "accepted" or joined.certificate is None:
            return False
        cert = join.check_certificate(joined.certificate, key, node_id, ca_pem, address)
    except EdgeUnavailable as e:
        log.info("could not ask edge %s for a renewed certificate: %s", address, e)
        return False
    identity.install_renewal(cert)
    log.info("node %s picked up the certificate of a renewal whose answer was lost", node.name)
    return True
