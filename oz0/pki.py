"""Master key, sealed CAs and the certificates they sign.

Every certificate names its holder in the subject: CN is the name (an operator's name,
a server's ID, a node's ID), OU its role, O the cluster. The role is what the API and
Temporal's authorizer look at, so it is set only here.
"""

from __future__ import annotations

import datetime as dt
import enum
import ipaddress
import logging
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidTag, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from oz0.errors import MasterKeyError, WrongMasterKey
from oz0_common.certs import (
    BACKDATE,
    NODE_RENEW_AT,
    Identity,
    Role,
    ca_hash,
    cert_from_pem,
    cert_to_pem,
    identity_of,
    identity_of_der,
    issued_at,
    key_from_pem,
    key_to_pem,
    make_csr,
    new_private_key,
    read_private,
    renewal_point,
    utcnow,
)

# The shared names, re-exported: the server's code says pki.X for these too.
__all__ = [
    "BACKDATE",
    "NODE_RENEW_AT",
    "Identity",
    "Role",
    "ca_hash",
    "cert_from_pem",
    "cert_to_pem",
    "identity_of",
    "identity_of_der",
    "issued_at",
    "key_from_pem",
    "key_to_pem",
    "make_csr",
    "new_private_key",
    "read_private",
    "renewal_point",
    "utcnow",
]

log = logging.getLogger(__name__)

MASTER_KEY_BYTES = 32
_NONCE_BYTES = 12
# Version 1 (clusters made before schema 4) bound only the cluster name; version 2 also
# binds what the secret is, so one sealed secret cannot stand in for another.
_SEAL_V1 = b"\x01"
_SEAL_V2 = b"\x02"


class Sealed(enum.StrEnum):
    """What a sealed secret is: part of its associated data."""

    CLUSTER_CA_KEY = "cluster-ca-key"
    INTERNODE_CA_KEY = "internode-ca-key"
    UI_CA_KEY = "ui-ca-key"
    # A job's secret environment value; bound to its job ID and name (oz0/jobs/secret_env.py).
    JOB_SECRET = "job-secret"
    # A chunk of a session's recording; bound to its session ID and number (oz0/node_sessions.py).
    SESSION = "session-recording"


def _associated_data(cluster_name: str, what: Sealed, bound: tuple[str, ...] = ()) -> bytes:
    # BOUND (none for the CAs: their associated data stays as it was) names which one of
    # its kind a secret is, so that it cannot be moved to stand for another.
    return b"\0".join(
        (
            b"oz0-sealed-v2",
            cluster_name.encode(),
            what.value.encode(),
            *(part.encode() for part in bound),
        )
    )


CA_VALIDITY = dt.timedelta(days=3650)
OPERATOR_VALIDITY = dt.timedelta(days=90)
SERVER_VALIDITY = dt.timedelta(days=7)
# Clocks of servers and operators drift; a certificate made a moment ago must still verify.

# Node certificates: valid a year, renewed by the agent over its control stream once
# NODE_RENEW_AT of that has passed; the edge grants a renewal from NODE_RENEW_EARLIEST on
# (a node whose clock runs ahead is not refused, and no node renews over and over).
NODE_VALIDITY = dt.timedelta(days=365)
NODE_RENEW_EARLIEST = 1 / 2
# A tuning option (docs/manage-nodes.md), for trying renewal out: seconds, at least 10.
NODE_VALIDITY_ENV = "OZ0_NODE_CERT_VALIDITY"
_MIN_NODE_VALIDITY = dt.timedelta(seconds=10)


# --- master key --------------------------------------------------------------------------


def write_master_key(path: Path) -> bytes:
    """Create PATH holding 32 fresh random bytes, mode 0600; never overwrite a file."""
    key = secrets.token_bytes(MASTER_KEY_BYTES)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise MasterKeyError(f"{path} already exists; refusing to overwrite a master key") from None
    except OSError as e:
        raise MasterKeyError(f"cannot create master key file {path}: {e.strerror}") from None
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    return key


def read_master_key(path: Path) -> bytes:
    data = read_private(path, "master key file", MasterKeyError, MASTER_KEY_BYTES + 1)
    if len(data) != MASTER_KEY_BYTES:
        raise MasterKeyError(
            f"master key file {path} is not a master key "
            f"(expected {MASTER_KEY_BYTES} bytes, found {len(data)}{'+' if len(data) > 32 else ''})"
        )
    return data


def seal(
    master_key: bytes,
    plaintext: bytes,
    cluster_name: str,
    what: Sealed,
    *,
    bound: tuple[str, ...] = (),
) -> bytes:
    nonce = secrets.token_bytes(_NONCE_BYTES)
    ad = _associated_data(cluster_name, what, bound)
    return _SEAL_V2 + nonce + AESGCM(master_key).encrypt(nonce, plaintext, ad)


def unseal(
    master_key: bytes,
    sealed: bytes,
    cluster_name: str,
    what: Sealed,
    *,
    legacy: bool = False,
    bound: tuple[str, ...] = (),
) -> bytes:
    """The plaintext of SEALED, if the master key sealed it as WHAT of CLUSTER_NAME (and,
    given BOUND, as that one of its kind, such as a job's ID and a name).

    LEGACY also accepts version 1, which names only the cluster: only for a cluster whose
    secrets were never re-sealed (see `cluster.reseal_legacy`).
    """
    version = sealed[:1]
    if version == _SEAL_V2:
        ad = _associated_data(cluster_name, what, bound)
    elif version == _SEAL_V1 and legacy:
        ad = cluster_name.encode()
    else:
        raise WrongMasterKey(f"sealed {what.value} of cluster {cluster_name} has an unknown format")
    nonce, ciphertext = sealed[1 : 1 + _NONCE_BYTES], sealed[1 + _NONCE_BYTES :]
    try:
        return AESGCM(master_key).decrypt(nonce, ciphertext, ad)
    except InvalidTag:
        # Also what a secret sealed as something else gives: the key cannot tell the two.
        raise WrongMasterKey(f"master key does not match cluster {cluster_name}") from None


# --- keys and certificates -----------------------------------------------------------------


def _name(common_name: str, role: str, cluster: str) -> x509.Name:
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, cluster),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def subject_alt_names(names: Iterable[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(name)))
        except ValueError:
            out.append(x509.DNSName(name))
    return out


@dataclass(frozen=True)
class CertificateAuthority:
    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    # Worked out once, not for each certificate issued (a join is one).
    @cached_property
    def cluster(self) -> str:
        return identity_of(self.cert).cluster

    @cached_property
    def _authority_key_identifier(self) -> x509.AuthorityKeyIdentifier:
        return x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())

    def issue(
        self,
        public_key: ec.EllipticCurvePublicKey,
        *,
        name: str,
        role: Role,
        validity: dt.timedelta,
        sans: Iterable[str] = (),
        server: bool = False,
        client: bool = True,
        now: dt.datetime | None = None,
    ) -> x509.Certificate:
        now = now or utcnow()
        usages = []
        if server:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        if client:
            usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(name, role.value, self.cluster))
            .issuer_name(self.cert.subject)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(min(now + validity, self.cert.not_valid_after_utc))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=True,
                    key_cert_sign=False,
                    crl_sign=False,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(self._authority_key_identifier, critical=False)
        )
        alt_names = subject_alt_names(sans)
        if alt_names:
            builder = builder.add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def sealed_key(self, master_key: bytes, what: Sealed) -> bytes:
        return seal(master_key, key_to_pem(self.key), self.cluster, what)


def new_ca(
    cluster: str,
    purpose: str,
    now: dt.datetime | None = None,
    *,
    name_constraints: x509.NameConstraints | None = None,
) -> CertificateAuthority:
    """A self-signed ECDSA P-256 CA; PURPOSE is `cluster`, `internode` or `ui`.

    NAME_CONSTRAINTS, if given, go in as a critical extension: whoever trusts the CA trusts
    it only for those names (RFC 5280 4.2.1.10; browsers and OpenSSL enforce them on a
    trust anchor too)."""
    now = now or utcnow()
    key = new_private_key()
    subject = _name(f"{cluster} {purpose} CA", f"{purpose}-ca", cluster)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if name_constraints is not None:
        builder = builder.add_extension(name_constraints, critical=True)
    return CertificateAuthority(cert=builder.sign(key, hashes.SHA256()), key=key)


# --- the web UI's CA -------------------------------------------------------------------------

# A name of each kind that nothing can ever be (RFC 6761 reserves `invalid`; 0.0.0.0 is no
# host's address). RFC 5280 leaves a kind of name that no permitted subtree mentions
# unconstrained: a UI CA permitting only IP addresses would still be good for any DNS name.
# Permitting one of these makes each kind constrained even when the cluster has no name of it.
_NO_DNS_NAME = "invalid"
_NO_IP_ADDRESS = ipaddress.ip_network("0.0.0.0/32")


def ui_name_constraints(names: Iterable[str]) -> x509.NameConstraints:
    """Name constraints permitting exactly NAMES (IP addresses, each alone; DNS names, each
    with its subdomains, as RFC 5280 has it) and nothing else of either kind."""
    dns: list[x509.GeneralName] = []
    ips: list[x509.GeneralName] = []
    for name in dict.fromkeys(names):
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            dns.append(x509.DNSName(name.lower()))
        else:
            ips.append(x509.IPAddress(ipaddress.ip_network(address)))
    return x509.NameConstraints(
        permitted_subtrees=(dns or [x509.DNSName(_NO_DNS_NAME)])
        + (ips or [x509.IPAddress(_NO_IP_ADDRESS)]),
        excluded_subtrees=None,
    )


def new_ui_ca(
    cluster: str, names: Iterable[str], now: dt.datetime | None = None
) -> CertificateAuthority:
    """The CA of the web UI's certificates, the one browsers are asked to trust: good only for
    NAMES (the cluster's advertised addresses and names), so that whoever holds its key (or
    the master key) cannot impersonate any other site to them."""
    return new_ca(cluster, "ui", now, name_constraints=ui_name_constraints(names))


def permitted_names(ca: x509.Certificate, names: Iterable[str]) -> tuple[list[str], list[str]]:
    """NAMES split into those CA's name constraints permit and those they do not."""
    try:
        constraints = ca.extensions.get_extension_for_class(x509.NameConstraints).value
    except x509.ExtensionNotFound:
        return list(dict.fromkeys(names)), []
    dns = [
        n.value.lower() for n in constraints.permitted_subtrees or () if isinstance(n, x509.DNSName)
    ]
    networks = [
        n.value
        for n in constraints.permitted_subtrees or ()
        if isinstance(n, x509.IPAddress)
        and isinstance(n.value, ipaddress.IPv4Network | ipaddress.IPv6Network)
    ]
    inside: list[str] = []
    outside: list[str] = []
    for name in dict.fromkeys(names):
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            lowered = name.lower()
            ok = any(lowered == d or lowered.endswith("." + d) for d in dns)
        else:
            ok = any(address.version == n.version and address in n for n in networks)
        (inside if ok else outside).append(name)
    return inside, outside


def load_ca(
    cert_pem: bytes,
    sealed_key: bytes,
    master_key: bytes,
    cluster: str,
    what: Sealed,
    *,
    legacy: bool = False,
) -> CertificateAuthority:
    key = key_from_pem(unseal(master_key, sealed_key, cluster, what, legacy=legacy))
    cert = cert_from_pem(cert_pem)
    if cert.public_key().public_numbers() != key.public_key().public_numbers():  # type: ignore[union-attr]
        raise WrongMasterKey(f"CA key and certificate of cluster {cluster} do not belong together")
    return CertificateAuthority(cert=cert, key=key)


def node_validity() -> dt.timedelta:
    """How long a node certificate issued now is valid: NODE_VALIDITY, unless the server's
    environment sets OZ0_NODE_CERT_VALIDITY (seconds). A bad value is logged and ignored:
    a tuning option must not stop nodes from joining."""
    raw = os.environ.get(NODE_VALIDITY_ENV)
    if raw is None:
        return NODE_VALIDITY
    try:
        validity = dt.timedelta(seconds=int(raw))
    except ValueError:
        validity = dt.timedelta(0)
    if validity < _MIN_NODE_VALIDITY:
        log.warning(
            "ignoring %s=%r (a whole number of seconds, at least %d, is needed): node "
            "certificates are valid for %s",
            NODE_VALIDITY_ENV,
            raw,
            _MIN_NODE_VALIDITY.seconds,
            NODE_VALIDITY,
        )
        return NODE_VALIDITY
    return validity


def csr_public_key(csr_pem: bytes) -> ec.EllipticCurvePublicKey:
    """The P-256 public key of a CSR whose self-signature holds; ValueError otherwise."""
    csr = x509.load_pem_x509_csr(csr_pem)
    try:
        if not csr.is_signature_valid:
            raise ValueError("certificate request signature is not valid")
        key = csr.public_key()
    except UnsupportedAlgorithm:
        # A key on a curve cryptography does not know: no P-256 key either.
        raise ValueError("certificate request must hold an ECDSA P-256 key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError("certificate request must hold an ECDSA P-256 key")
    return key
