"""Purge commands: what the edge sends a purging node, signed with the cluster CA's key.

The node verifies them against the CA certificate it holds (docs/node-protocol.md,
"Purge"). Each delivery gets a fresh nonce and names the connection's challenge, so a
command captured on one connection is worthless on any other.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import pki


@dataclass(frozen=True)
class PurgeCommand:
    nonce: str
    command: str
    signature: str


def sign(
    ca: pki.CertificateAuthority, *, cluster: str, node_id: str, challenge: bytes
) -> PurgeCommand:
    nonce = secrets.token_hex(16)
    payload = {
        "action": "purge",
        "cluster": cluster,
        "node_id": node_id,
        "nonce": nonce,
        "challenge": challenge.hex(),
        "issued_at": pki.utcnow().isoformat(),
    }
    data = json.dumps(payload, separators=(",", ":"), sort_keys=True).encode()
    signature = ca.key.sign(data, ec.ECDSA(hashes.SHA256()))
    return PurgeCommand(
        nonce, base64.b64encode(data).decode(), base64.b64encode(signature).decode()
    )
