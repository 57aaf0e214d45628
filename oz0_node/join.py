"""Joining a cluster: pin its CA, ask for a certificate, and wait for it while pending.

1. Pin: an unverified connection to `/join` reads the edge's `hello`; its CA must hash to
   `--ca-hash`, or the agent stops (a wrong hash is never retried elsewhere).
2. Join: on a connection verified against the pinned CA, send `join` with a CSR of the node
   key; the answer gives the node ID and either the certificate or `pending`.
3. Pickup: while pending, connect again and again, each time proving the key by signing
   the connection's challenge; the edge holds the answer until the node's state changes,
   so the certificate arrives as soon as an operator accepts the node.

Unreachable or misbehaving edges are skipped by the reconnect policy; refusals that no
other edge would answer differently (token, rejection, unknown node) end the agent.
"""

from __future__ import annotations

import base64
import logging
import random
import ssl
from dataclasses import dataclass, field

import trio
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from oz0_common import certs
from oz0_node.errors import AgentError, EdgeUnavailable, ProtocolViolation
from oz0_node.messages import Hello, Joined, Message, Refusal, kind, optional_text
from oz0_node.node import Node
from oz0_node.reconnect import Reconnect
from oz0_node.tls import pinning_context
from oz0_node.transport import EdgeConnection, OpenStream, open_edge, open_tcp

log = logging.getLogger(__name__)

JOIN_PATH = "/join"
HELLO_TIMEOUT = 10.0
JOIN_ANSWER_TIMEOUT = 30.0
# The edge holds a pickup up to 30 s before answering `pending`.
PICKUP_ANSWER_TIMEOUT = 40.0
# An edge that answers `pending` at once must not be asked again in a tight loop.
PICKUP_MIN_INTERVAL = 1.0


@dataclass(frozen=True)
class PinnedCa:
    cluster: str
    ca_hash: str
    ca_pem: bytes


@dataclass(frozen=True)
class JoinRequest:
    token: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    hostname: str = ""


# --- 1. pin -----------------------------------------------------------------------------


async def pin_ca(
    edges: list[str],
    expected_hash: str,
    *,
    open_stream: OpenStream = open_tcp,
    rng: random.Random | None = None,
) -> PinnedCa:
    """The cluster CA as the first edge that answers offers it, if it hashes to EXPECTED_HASH."""
    policy = Reconnect(lambda: edges, rng=rng)
    while True:
        address = await policy.next_edge()
        try:
            async with open_edge(
                address, JOIN_PATH, pinning_context(), cluster=None, open_stream=open_stream
            ) as conn:
                hello = Hello.parse(await conn.receive(HELLO_TIMEOUT), address)
        except EdgeUnavailable as e:
            log.warning("%s; trying the next edge", e)
            continue
        return check_pin(hello, expected_hash, address)


def check_pin(hello: Hello, expected_hash: str, address: str) -> PinnedCa:
    try:
        ca = certs.cert_from_pem(hello.ca_pem.encode())
    except ValueError:
        raise AgentError(f"edge {address} presented no readable CA certificate") from None
    presented = certs.ca_hash(ca)
    if presented != expected_hash:
        raise AgentError(
            f"CA hash mismatch: edge {address} presented {presented}, expected {expected_hash}"
        )
    cluster = certs.identity_of(ca).cluster
    if hello.cluster != cluster:
        raise AgentError(
            f"edge {address} says it serves cluster {hello.cluster!r}, "
            f"but its CA is cluster {cluster!r}'s"
        )
    log.info("pinned the CA of cluster %s (%s) from edge %s", cluster, presented, address)
    return PinnedCa(cluster=cluster, ca_hash=presented, ca_pem=certs.cert_to_pem(ca))


# --- 2 and 3. join, then pick up --------------------------------------------------------


async def obtain_certificate(
    node: Node,
    key: ec.EllipticCurvePrivateKey,
    request: JoinRequest,
    tls: ssl.SSLContext,
    ca_pem: bytes,
    *,
    open_stream: OpenStream = open_tcp,
    rng: random.Random | None = None,
) -> x509.Certificate:
    """Join (unless node.json has a node ID already), then pick up until accepted."""
    policy = Reconnect(node.edges, rng=rng)
    told_pending = False
    while True:
        address = await policy.next_edge()
        started = trio.current_time()
        try:
            async with open_edge(
                address, JOIN_PATH, tls, cluster=node.record.cluster, open_stream=open_stream
            ) as conn:
                if node.record.node_id is None:
                    answer = await _join(conn, key, request)
                else:
                    answer = await pickup(conn, key, node.record.node_id)
            cert = _take_answer(node, answer, key, ca_pem, address)
        except EdgeUnavailable as e:
            log.warning("%s; trying the next edge", e)
            continue
        if cert is not None:
            return cert
        if not told_pending:
            log.info("node %s is pending: waiting for an operator to accept it", node.name)
            told_pending = True
        policy.reset()
        await trio.sleep_until(started + PICKUP_MIN_INTERVAL)


async def _join(
    conn: EdgeConnection, key: ec.EllipticCurvePrivateKey, request: JoinRequest
) -> Message:
    Hello.parse(await conn.receive(HELLO_TIMEOUT), conn.address)
    csr = certs.make_csr(key, request.hostname or "node").public_bytes(serialization.Encoding.PEM)
    await conn.send(
        "join",
        csr=csr.decode(),
        token=request.token,
        labels=request.labels,
        hostname=request.hostname,
    )
    return await conn.receive(JOIN_ANSWER_TIMEOUT)


async def pickup(conn: EdgeConnection, key: ec.EllipticCurvePrivateKey, node_id: str) -> Message:
    hello = Hello.parse(await conn.receive(HELLO_TIMEOUT), conn.address)
    await conn.send("pickup", node_id=node_id, signature=sign_challenge(key, hello, conn.address))
    return await conn.receive(PICKUP_ANSWER_TIMEOUT)


def sign_challenge(key: ec.EllipticCurvePrivateKey, hello: Hello, address: str) -> str:
    """ECDSA with SHA-256 over the challenge's bytes, DER, base64."""
    signature = key.sign(hello.challenge_bytes(address), ec.ECDSA(hashes.SHA256()))
    return base64.b64encode(signature).decode()


def _take_answer(
    node: Node, answer: Message, key: ec.EllipticCurvePrivateKey, ca_pem: bytes, address: str
) -> x509.Certificate | None:
    """The certificate if the answer brings it, None if still pending; raises otherwise."""
    answer_kind = kind(answer)
    if answer_kind == "joined":
        joined = Joined.parse(answer, address)
        if joined.state == "accepted":
            if joined.certificate is None:
                raise ProtocolViolation(f"edge {address}: accepted without a certificate")
            cert = check_certificate(joined.certificate, key, joined.node_id, ca_pem, address)
            node.identity.save_certificate(cert)
            node.remember(
                node_id=joined.node_id, tenant=joined.tenant, state="accepted", edges=joined.edges
            )
            log.info("node %s accepted in tenant %s", joined.node_id, joined.tenant)
            return cert
        node.remember(
            node_id=joined.node_id, tenant=joined.tenant, state=joined.state, edges=joined.edges
        )
        if joined.state == "rejected":
            raise AgentError(f"node {joined.node_id} was rejected")
        return None
    if answer_kind == "pending":
        node.remember(state="pending")
        return None
    if answer_kind == "rejected":
        reason = optional_text(answer, "reason", address) or "no reason given"
        node.remember(state="rejected")
        raise AgentError(f"node {node.name} was rejected: {reason}")
    if answer_kind == "error":
        refusal = Refusal.parse(answer, address)
        if refusal.code == "token_refused":
            raise AgentError(f"join token refused: {refusal.message}")
        if refusal.code == "bad_request":
            raise AgentError(f"edge {address} refused the request: {refusal.message}")
        if refusal.code == "unknown_node":
            raise AgentError(
                f"the cluster does not know node {node.name} (was it deleted?); "
                f"to join again, start with a new --data-dir"
            )
        raise EdgeUnavailable(f"edge {address} answered {refusal.code}: {refusal.message}")
    raise ProtocolViolation(f"edge {address} answered {answer_kind!r} on {JOIN_PATH}")


def check_certificate(
    pem: str, key: ec.EllipticCurvePrivateKey, node_id: str, ca_pem: bytes, address: str
) -> x509.Certificate:
    """The node certificate the edge sent, if the pinned CA issued it to this key and node."""
    try:
        cert = certs.cert_from_pem(pem.encode())
        ca = certs.cert_from_pem(ca_pem)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise ProtocolViolation(
            f"edge {address} sent a certificate the cluster CA did not issue"
        ) from None
    identity = certs.identity_of(cert)
    ours = key.public_key().public_numbers()
    theirs = cert.public_key()
    if not isinstance(theirs, ec.EllipticCurvePublicKey) or theirs.public_numbers() != ours:
        raise ProtocolViolation(f"edge {address} sent a certificate for another key")
    if (identity.role, identity.name, identity.cluster) != (
        certs.Role.NODE,
        node_id,
        certs.identity_of(ca).cluster,
    ):
        raise ProtocolViolation(
            f"edge {address} sent a certificate for {identity.role} {identity.name!r}, "
            f"not node {node_id}"
        )
    return cert
