"""A job's secret environment, encrypted to the one node that runs one attempt.

The server that places an attempt seals the job's secret values to the placed node's public
key (its certificate's P-256 key); only that node's private key opens them. Temporal's
history carries nothing else of them, so a server, an operator or the database alone
cannot read them from there (docs/node-protocol.md, "Secrets").

ECIES: a fresh P-256 key per envelope, ECDH with the node's key, HKDF-SHA256 over the shared
secret (its info names the format, job, attempt and node), AES-256-GCM whose associated
data is the whole header and the same names. So an envelope opens only for the node, job
and attempt it was made for: moved to another job, attempt or node it is refused.

    envelope = version (1 byte, 1) | recipient key hash (32: SHA-256 of its
               SubjectPublicKeyInfo DER) | ephemeral public key (65: uncompressed point) |
               nonce (12) | AES-GCM ciphertext and tag of a JSON object {NAME: VALUE}

carried as one string: the envelope in standard base64.

Errors never hold a value: only what is wrong with the envelope.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import secrets

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

VERSION = b"\x01"
FORMAT = b"oz0-sealed-env-v1"
_HASH_BYTES = 32
_POINT_BYTES = 65
_NONCE_BYTES = 12
_HEADER_BYTES = len(VERSION) + _HASH_BYTES + _POINT_BYTES + _NONCE_BYTES
# Twice what a job may hold (64 values of 32 KiB, names and JSON around them), in base64.
MAX_ENVELOPE_TEXT = 4 * 1024 * 1024


class SealedEnvError(Exception):
    """An envelope this key cannot open: the message says why, never what it holds."""


class NotForThisKey(SealedEnvError):
    """The envelope was sealed to another key (the node's previous one, after a renewal)."""


def key_sha256(key: ec.EllipticCurvePublicKey) -> bytes:
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).digest()


def _bound(job_id: str, attempt: int, node_id: str) -> bytes:
    return b"\0".join((FORMAT, job_id.encode(), str(attempt).encode(), node_id.encode()))


def _key(shared: bytes, ephemeral: bytes, bound: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=ephemeral, info=bound).derive(shared)


def seal(
    recipient: ec.EllipticCurvePublicKey,
    values: dict[str, str],
    *,
    job_id: str,
    attempt: int,
    node_id: str,
) -> str:
    """VALUES sealed to RECIPIENT for attempt ATTEMPT of JOB_ID on NODE_ID (base64)."""
    if not isinstance(recipient.curve, ec.SECP256R1):
        raise SealedEnvError(f"node {node_id}'s key is not a P-256 key")
    ephemeral_key = ec.generate_private_key(ec.SECP256R1())
    ephemeral = ephemeral_key.public_key().public_bytes(
        serialization.Encoding.X962, serialization.PublicFormat.UncompressedPoint
    )
    bound = _bound(job_id, attempt, node_id)
    key = _key(ephemeral_key.exchange(ec.ECDH(), recipient), ephemeral, bound)
    nonce = secrets.token_bytes(_NONCE_BYTES)
    header = VERSION + key_sha256(recipient) + ephemeral + nonce
    plaintext = json.dumps(values, separators=(",", ":"), sort_keys=True).encode()
    sealed = AESGCM(key).encrypt(nonce, plaintext, header + bound)
    return base64.b64encode(header + sealed).decode("ascii")


def open_sealed(
    private_key: ec.EllipticCurvePrivateKey,
    text: str,
    *,
    job_id: str,
    attempt: int,
    node_id: str,
) -> dict[str, str]:
    """The values TEXT holds, if it was sealed to PRIVATE_KEY's public key for exactly this
    job, attempt and node; else SealedEnvError (NotForThisKey: sealed to another key)."""
    if len(text) > MAX_ENVELOPE_TEXT:
        raise SealedEnvError("the secrets envelope is too large")
    try:
        envelope = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise SealedEnvError("the secrets envelope is not base64") from None
    if len(envelope) < _HEADER_BYTES + 16 or envelope[:1] != VERSION:
        raise SealedEnvError("the secrets envelope is not of a format this node knows")
    header, sealed = envelope[:_HEADER_BYTES], envelope[_HEADER_BYTES:]
    recipient_hash = header[1 : 1 + _HASH_BYTES]
    ephemeral = header[1 + _HASH_BYTES : 1 + _HASH_BYTES + _POINT_BYTES]
    nonce = header[-_NONCE_BYTES:]
    if not secrets.compare_digest(recipient_hash, key_sha256(private_key.public_key())):
        raise NotForThisKey(
            "the secrets were sealed to another key than this node's (renewed since?)"
        )
    try:
        peer = ec.EllipticCurvePublicKey.from_encoded_point(ec.SECP256R1(), ephemeral)
    except ValueError:
        raise SealedEnvError("the secrets envelope's ephemeral key is not a P-256 point") from None
    bound = _bound(job_id, attempt, node_id)
    key = _key(private_key.exchange(ec.ECDH(), peer), ephemeral, bound)
    try:
        plaintext = AESGCM(key).decrypt(nonce, sealed, header + bound)
    except InvalidTag:
        raise SealedEnvError(
            "the secrets envelope does not open: it was altered, or sealed for another job,"
            " attempt or node"
        ) from None
    try:
        values = json.loads(plaintext)
    except ValueError:
        raise SealedEnvError("the secrets envelope holds no JSON object") from None
    if not isinstance(values, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in values.items()
    ):
        raise SealedEnvError("the secrets envelope holds no object of names to text")
    return values
