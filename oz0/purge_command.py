"""Purge commands: what the edge sends a purging node, signed with the cluster CA's key.

The node verifies them against the CA certificate it holds (docs/node-protocol.md,
"Purge"). Each delivery gets a fresh nonce and names the connection's challenge, so a
command captured on one connection is worthless on any other.
"""

from __future__ import annotations

import base64
import secrets
from dataclasses import dataclass

from oz0 import pki
from oz0_common import purge_format


@dataclass(frozen=True)
class PurgeCommand:
    nonce: str
    command: str
    signature: str


def sign(
    ca: pki.CertificateAuthority, *, cluster: str, node_id: str, challenge: bytes
) -> PurgeCommand:
    nonce = secrets.token_hex(purge_format.NONCE_BYTES)
    data = purge_format.encode(
        purge_format.payload(
            cluster=cluster, node_id=node_id, nonce=nonce, challenge=challenge,
            issued_at=pki.utcnow().isoformat(),
        )
    )  # fmt: skip
    signature = ca.key.sign(data, purge_format.signature_algorithm())
    return PurgeCommand(
        nonce, base64.b64encode(data).decode(), base64.b64encode(signature).decode()
    )
