"""Joining: a node's first request (with a token, accepted at once; without, pending), the
same request repeated, and a pending node picking up its answer."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg.types.json import Jsonb

from oz0 import audit, pki
from oz0.nodes._model import public_key_sha256
from oz0.nodes._rules import (
    DEFAULT_TENANT,
    NodeError,
    NodeNotFound,
    check_labels,
    new_node_id,
    under_token,
)

# Serialises tokenless joins so that concurrent ones cannot pass the limit together.
_PENDING_LOCK = 0x6F7A305F70656E64


class TooManyPending(NodeError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"this cluster already has {limit} nodes waiting for an operator, its limit;"
            " ask an operator to accept or reject some, or join with a token"
        )
        self.limit = limit


def check_room_for_pending(conn: psycopg.Connection[Any], limit: int) -> None:
    """Raise TooManyPending if LIMIT nodes are pending; held until the transaction ends."""
    conn.execute("SELECT pg_advisory_xact_lock(%s)", (_PENDING_LOCK,))
    row = conn.execute("SELECT count(*) FROM nodes WHERE state = 'pending'").fetchone()
    if row is not None and int(row[0]) >= limit:
        raise TooManyPending(limit)


@dataclass(frozen=True)
class Joined:
    node_id: str
    state: str
    tenant: str
    certificate: str | None


def issue_certificate(
    ca: pki.CertificateAuthority, node_id: str, public_key: ec.EllipticCurvePublicKey
) -> str:
    cert = ca.issue(public_key, name=node_id, role=pki.Role.NODE, validity=pki.node_validity())
    return pki.cert_to_pem(cert).decode()


def join(
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    *,
    csr_pem: str,
    labels: dict[str, str],
    hostname: str,
    token_id: str | None = None,
    token_tenant: str | None = None,
    token_labels: dict[str, str] | None = None,
) -> Joined:
    """Add a node: accepted in the token's tenant when a token was consumed, else pending."""
    try:
        public_key = pki.csr_public_key(csr_pem.encode())
    except ValueError as e:
        raise NodeError(f"bad certificate request: {e}") from None
    labels = under_token(token_labels or {}, check_labels(labels))
    hostname = hostname[:253] if isinstance(hostname, str) else ""
    node_id = new_node_id()
    accepted = token_id is not None
    state = "accepted" if accepted else "pending"
    tenant = token_tenant if accepted and token_tenant else DEFAULT_TENANT
    certificate = issue_certificate(ca, node_id, public_key) if accepted else None
    conn.execute(
        "INSERT INTO nodes (id, tenant, state, labels, hostname, token_id, public_key,"
        " public_key_sha256, certificate) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)",
        (
            node_id,
            tenant,
            state,
            Jsonb(labels),
            hostname,
            token_id,
            public_key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode(),
            public_key_sha256(public_key),
            certificate,
        ),
    )
    audit.record(
        conn,
        audit.Actor("node", node_id),
        "node.join",
        f"node:{node_id}",
        {"state": state, "tenant": tenant, "token_id": token_id, "hostname": hostname},
        tenants=[tenant],
    )
    return Joined(node_id, state, tenant, certificate)


def rejoin(conn: psycopg.Connection[Any], csr_pem: str) -> Joined | None:
    """The node a repeated join of the same key refers to, or None for a new key.

    An agent whose connection broke before the answer asks again; it must get the node it
    already is, not a second one (and must not use its token twice).
    """
    try:
        public_key = pki.csr_public_key(csr_pem.encode())
    except ValueError as e:
        raise NodeError(f"bad certificate request: {e}") from None
    row = conn.execute(
        "SELECT id, state, tenant, certificate FROM nodes WHERE public_key_sha256 = %s",
        (public_key_sha256(public_key),),
    ).fetchone()
    if row is None:
        return None
    node_id, state, tenant, certificate = row
    if state not in ("pending", "accepted"):
        raise NodeError(f"this key belongs to node {node_id}, which is {state}")
    return Joined(str(node_id), str(state), str(tenant), certificate)


@dataclass(frozen=True)
class Pickup:
    state: str
    certificate: str | None
    reason: str | None
    tenant: str


def pickup(
    conn: psycopg.Connection[Any], node_id: str, challenge: bytes, signature_b64: str
) -> Pickup:
    """The node's state, if the node proves it holds its key by signing CHALLENGE."""
    row = conn.execute(
        "SELECT state, public_key, certificate, reason, tenant FROM nodes WHERE id = %s",
        (node_id,),
    ).fetchone()
    if row is None or not row[1]:
        raise NodeNotFound(f"node {node_id} not found")
    public_key = serialization.load_pem_public_key(str(row[1]).encode())
    assert isinstance(public_key, ec.EllipticCurvePublicKey)
    try:
        public_key.verify(
            base64.b64decode(signature_b64, validate=True), challenge, ec.ECDSA(hashes.SHA256())
        )
    except (InvalidSignature, ValueError):
        raise NodeNotFound(f"node {node_id} not found") from None
    return Pickup(str(row[0]), row[2], row[3], str(row[4]))
