"""`renew` on a control stream: an accepted node swaps its certificate for a new one.

The node sends a CSR of a fresh key (proof that it holds that key); the stream's
certificate proves it holds the current one. In one transaction, with the node's row
locked: the row must still be this node with the stream's key and accepted (a blocked,
purging or deleted node cannot renew), the current certificate must have reached
NODE_RENEW_EARLIEST of its validity, and the new key must be new to the cluster; then
the new certificate, key and key hash replace the old ones and `node.renew` is audited.
From then on a control stream with the old certificate is refused (its key no longer
matches the row), so the node reconnects with the new one.
"""

from __future__ import annotations

import datetime as dt
import logging
from functools import partial
from typing import Any

import psycopg
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import audit, nodes, pki
from oz0.errors import Oz0Error
from oz0.server.edge.common import DatabaseUnavailable, Edge, send
from oz0.server.edge.wire import Wire

log = logging.getLogger(__name__)

RENEW = "renew"


class RenewRefused(Oz0Error):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


async def answer(
    edge: Edge,
    ws: Wire,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    message: dict[str, Any],
) -> None:
    """Answer one `renew` with `renewed` (the certificate) or `renew_refused`."""
    csr = message.get("csr")
    try:
        if not isinstance(csr, str):
            raise RenewRefused("bad_request", "renew needs a PEM csr")
        pem = await edge.transaction(
            partial(
                renew,
                ca=edge.cluster.cluster_ca,
                node_id=node_id,
                key=key,
                csr_pem=csr,
                server_id=edge.server_id,
            )
        )
    except RenewRefused as refused:
        log.info("refused to renew node %s: %s", node_id, refused)
        await send(ws, "renew_refused", code=refused.code, message=str(refused))
        return
    except DatabaseUnavailable as e:
        # The stream outlives the outage; the agent asks again later.
        await send(ws, "renew_refused", code=e.code, message=e.message)
        return
    log.info("renewed the certificate of node %s", node_id)
    await send(ws, "renewed", certificate=pem)


def renew(
    conn: psycopg.Connection[Any],
    *,
    ca: pki.CertificateAuthority,
    node_id: str,
    key: ec.EllipticCurvePublicKey,
    csr_pem: str,
    server_id: str,
    now: dt.datetime | None = None,
) -> str:
    """The node's new certificate (PEM), stored with its key; RenewRefused says why not."""
    now = now or pki.utcnow()
    try:
        new_key = pki.csr_public_key(csr_pem.encode())
    except ValueError as e:
        raise RenewRefused("bad_request", f"bad certificate request: {e}") from None
    row = conn.execute(
        "SELECT state, certificate, tenant FROM nodes WHERE id = %s AND public_key_sha256 = %s"
        " FOR UPDATE",
        (node_id, nodes.public_key_sha256(key)),
    ).fetchone()
    if row is None:
        raise RenewRefused("unknown", f"node {node_id} with this certificate is not known")
    state, current_pem = str(row[0]), row[1]
    if state != "accepted" or not current_pem:
        raise RenewRefused(state, f"node {node_id} is {state}; only accepted nodes renew")
    earliest = pki.renewal_point(
        pki.cert_from_pem(str(current_pem).encode()), pki.NODE_RENEW_EARLIEST
    )
    if now < earliest:
        raise RenewRefused(
            "too_early",
            f"node {node_id}'s certificate can be renewed from {earliest.isoformat()} on",
        )
    new_hash = nodes.public_key_sha256(new_key)
    taken = conn.execute("SELECT id FROM nodes WHERE public_key_sha256 = %s", (new_hash,))
    if taken.fetchone() is not None:
        raise RenewRefused("bad_request", "a renewal needs a key no node has")
    cert = ca.issue(
        new_key, name=node_id, role=pki.Role.NODE, validity=pki.node_validity(), now=now
    )
    pem = pki.cert_to_pem(cert).decode()
    conn.execute(
        "UPDATE nodes SET public_key = %s, public_key_sha256 = %s, certificate = %s WHERE id = %s",
        (
            new_key.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ).decode(),
            new_hash,
            pem,
            node_id,
        ),
    )
    audit.record(
        conn,
        audit.Actor("node", node_id),
        "node.renew",
        f"node:{node_id}",
        {
            "serial": format(cert.serial_number, "x"),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "server": server_id,
        },
        tenants=[row[2]],
    )
    return pem
