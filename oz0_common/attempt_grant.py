"""The attempt grant's format, which the server that places an attempt signs and the node
checks before it runs anything (docs/node-protocol.md, "Signed attempts").

The signed bytes are PREFIX followed by a canonical JSON object (keys sorted, compact),
signed with the cluster CA's key (ECDSA P-256, SHA-256); the attempt's input carries them
as `"grant": {"payload": base64, "signature": base64}`. PREFIX keeps the CA's signatures
apart: a purge command's signed bytes are a bare JSON object (they begin with `{`), a
certificate's are DER (they begin with 0x30), and neither ever begins with PREFIX; nor
does a grant's parse as either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec

FORMAT = "oz0.attempt-grant/1"
PREFIX = FORMAT.encode() + b"\n"
# What the node compares with the input it is asked to run, field by field.
MATCHED = ("job_id", "attempt", "command", "env_digest", "limits", "timeout", "files", "user")


class MalformedGrant(ValueError):
    """The grant is not one: not base64, not this format, not a JSON object."""


def signature_algorithm() -> ec.ECDSA:
    return ec.ECDSA(hashes.SHA256())


def canonical(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def env_digest(env: Mapping[str, str], secrets: str | None) -> str:
    """SHA-256 (hex) of what reaches the process's environment: the job's `env` and its
    sealed `secrets` (null when none), so neither can be swapped under the signature."""
    return hashlib.sha256(canonical({"env": dict(env), "secrets": secrets})).hexdigest()


def payload(
    *,
    cluster: str,
    tenant: str,
    job_id: str,
    attempt: int,
    node_id: str,
    command: Sequence[str],
    env_digest: str,
    limits: Mapping[str, Any] | None,
    timeout: float | None,
    not_after: int,
    files: Sequence[Mapping[str, Any]] | None = None,
    user: str | None = None,
) -> dict[str, Any]:
    """The signed object; NOT_AFTER in whole seconds since the epoch (UTC). FILES (placed
    in the attempt's working directory, `job run --file`) only when there are some, USER
    (the account a session runs as, docs/sessions.md) only when it names one: a grant
    without either is the same as before they existed."""
    fields = {
        "format": FORMAT,
        "cluster": cluster,
        "tenant": tenant,
        "job_id": job_id,
        "attempt": attempt,
        "node_id": node_id,
        "command": list(command),
        "env_digest": env_digest,
        "limits": dict(limits) if limits is not None else None,
        "timeout": timeout,
        "not_after": not_after,
    }
    if files:
        fields["files"] = [dict(f) for f in files]
    if user is not None:
        fields["user"] = user
    return fields


def signed_bytes(fields: Mapping[str, Any]) -> bytes:
    return PREFIX + canonical(dict(fields))


def encode(data: bytes, signature: bytes) -> dict[str, str]:
    """The `grant` object of an attempt's input."""
    return {
        "payload": base64.b64encode(data).decode(),
        "signature": base64.b64encode(signature).decode(),
    }


def decode(grant: object) -> tuple[bytes, bytes]:
    """The signed bytes and the signature an attempt's `grant` carries; MalformedGrant."""
    if not isinstance(grant, dict):
        raise MalformedGrant("the attempt carries no grant")
    data, signature = grant.get("payload"), grant.get("signature")
    if not isinstance(data, str) or not isinstance(signature, str):
        raise MalformedGrant("the grant has no payload and signature")
    try:
        return base64.b64decode(data, validate=True), base64.b64decode(signature, validate=True)
    except (binascii.Error, ValueError):
        raise MalformedGrant("the grant's payload or signature is not base64") from None


def fields_of(data: bytes) -> dict[str, Any]:
    """The JSON object after PREFIX in DATA (signed bytes already verified); MalformedGrant."""
    if not data.startswith(PREFIX):
        raise MalformedGrant(f"the grant is not {FORMAT}")
    try:
        fields = json.loads(data[len(PREFIX) :].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise MalformedGrant("the grant's payload is not JSON") from None
    if not isinstance(fields, dict) or fields.get("format") != FORMAT:
        raise MalformedGrant(f"the grant's payload is not a {FORMAT} object")
    return fields
