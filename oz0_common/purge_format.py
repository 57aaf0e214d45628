"""The purge command's format, which the server signs and the node checks (docs/
node-protocol.md, "Purge"): a canonical JSON object, signed with the cluster CA's key
(ECDSA P-256, SHA-256), both sent in base64."""

from __future__ import annotations

import json
import re
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

ACTION = "purge"
# What the node checks against itself and its connection, each a text.
NAMED = ("cluster", "node_id", "challenge")
NONCE = re.compile(r"[0-9a-fA-F]{32}")
NONCE_BYTES = 16


def signature_algorithm() -> ec.ECDSA:
    return ec.ECDSA(hashes.SHA256())


def payload(
    *, cluster: str, node_id: str, nonce: str, challenge: bytes, issued_at: str
) -> dict[str, Any]:
    return {
        "action": ACTION,
        "cluster": cluster,
        "node_id": node_id,
        "nonce": nonce,
        "challenge": challenge.hex(),
        "issued_at": issued_at,
    }


def encode(fields: dict[str, Any]) -> bytes:
    """The bytes that are signed: compact, keys sorted."""
    return json.dumps(fields, separators=(",", ":"), sort_keys=True).encode()
