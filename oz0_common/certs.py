"""Certificates as both sides see them: keys and PEM, who a certificate names (CN the
holder, OU its role, O the cluster), the CA hash nodes pin, renewal points, requests.

The server's `oz0.pki` adds the CAs, sealing and issuing; the node agent carries only this.
"""

from __future__ import annotations

import datetime as dt
import enum
import functools
import hashlib
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from oz0_common.errors import Oz0Error

# Certificates are backdated by this much, for clocks that lag.
BACKDATE = dt.timedelta(minutes=5)
# A node renews its certificate once this share of its validity has passed.
NODE_RENEW_AT = 2 / 3
# The server name (SNI) our own clients send to a server's management port (8443): the
# server answers it with its cluster-CA certificate, every other name (or none, as a
# browser sends for an IP address) with the web UI's (oz0/server/tls.py says why).
API_SERVER_NAME = "api.oz0.invalid"


class Role(enum.StrEnum):
    OPERATOR = "operator"
    SERVER = "server"
    NODE = "node"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


# Where systemd puts a service's credentials (`LoadCredential=`: the server's unit).
CREDENTIALS_ENV = "CREDENTIALS_DIRECTORY"


def read_private(path: Path, what: str, error: type[Oz0Error], max_bytes: int = 1 << 16) -> bytes:
    """Read a secret file, refusing one that group or others may read."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        raise error(f"{what} {path} not found") from None
    except OSError as e:
        raise error(f"cannot read {what} {path}: {e.strerror}") from None
    try:
        mode = stat.S_IMODE(os.fstat(fd).st_mode)
        if mode & 0o077 and not _systemd_credential(path, mode):
            raise error(
                f"{what} {path} is open to group or others (mode {mode:04o}); run: chmod 600 {path}"
            )
        return os.read(fd, max_bytes)
    finally:
        os.close(fd)


def _systemd_credential(path: Path, mode: int) -> bool:
    """Whether PATH is one of this service's systemd credentials, which only the service
    reaches: systemd makes each 0400 and, where the file system has ACLs (tmpfs), lets the
    service's user read it with an ACL entry, whose mask `stat` shows as the group's read
    bit. Nothing more than that bit is let through."""
    directory = os.environ.get(CREDENTIALS_ENV)
    if not directory or mode & 0o037:
        return False
    return Path(path).absolute().parent == Path(directory).absolute()


def new_private_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def key_to_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def key_from_pem(pem: bytes) -> ec.EllipticCurvePrivateKey:
    key = serialization.load_pem_private_key(pem, password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError("not an EC private key")
    return key


def cert_to_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def cert_from_pem(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def ca_hash(cert: x509.Certificate) -> str:
    """`sha256:` and the hex SHA-256 of the certificate's SubjectPublicKeyInfo (DER)."""
    spki = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "sha256:" + hashlib.sha256(spki).hexdigest()


@dataclass(frozen=True)
class Identity:
    """Who a certificate says its holder is."""

    role: str
    name: str
    cluster: str
    serial: int
    not_after: dt.datetime


def identity_of(cert: x509.Certificate) -> Identity:
    def attr(oid: x509.ObjectIdentifier) -> str:
        values = cert.subject.get_attributes_for_oid(oid)
        return str(values[0].value) if values else ""

    return Identity(
        role=attr(NameOID.ORGANIZATIONAL_UNIT_NAME),
        name=attr(NameOID.COMMON_NAME),
        cluster=attr(NameOID.ORGANIZATION_NAME),
        serial=cert.serial_number,
        not_after=cert.not_valid_after_utc,
    )


@functools.lru_cache(maxsize=1024)
def identity_of_der(der: bytes) -> Identity:
    """`identity_of` a certificate in DER; the same bytes are parsed once (an operator's
    kept connection sends its certificate's requests one after another)."""
    return identity_of(x509.load_der_x509_certificate(der))


def issued_at(cert: x509.Certificate) -> dt.datetime:
    """When CERT was issued: its notBefore is backdated by BACKDATE for clock drift."""
    start = cert.not_valid_before_utc + BACKDATE
    return start if start <= cert.not_valid_after_utc else cert.not_valid_before_utc


def renewal_point(cert: x509.Certificate, share: float) -> dt.datetime:
    """The moment SHARE of CERT's validity (from its issue to its notAfter) has passed."""
    start = issued_at(cert)
    return start + (cert.not_valid_after_utc - start) * share


def make_csr(key: ec.EllipticCurvePrivateKey, name: str) -> x509.CertificateSigningRequest:
    return (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .sign(key, hashes.SHA256())
    )
