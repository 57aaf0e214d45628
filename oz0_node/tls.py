"""TLS towards edges.

Before the CA is pinned there is nothing to verify with: the pinning connection accepts any
certificate and only reads the CA the edge offers, which the caller checks by hash. Every
later connection verifies the edge's chain against the pinned CA and then that the
certificate names a server of our cluster (subject OU `server`, O the cluster). Host names
are not checked: a node reaches edges by whatever address it learnt, and the cluster CA
only ever signs server certificates for the cluster's own servers.
"""

from __future__ import annotations

import ssl
from pathlib import Path

from cryptography import x509

from oz0_common import certs
from oz0_node.errors import EdgeUnavailable


def _client_context() -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    return ctx


def pinning_context() -> ssl.SSLContext:
    """For the one connection that fetches the CA to pin; verifies nothing."""
    ctx = _client_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def edge_context(
    ca_pem: bytes, *, cert_path: Path | None = None, key_path: Path | None = None
) -> ssl.SSLContext:
    """Verify edges against CA_PEM; present CERT_PATH/KEY_PATH as client certificate if given."""
    ctx = _client_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(cadata=ca_pem.decode())
    if cert_path is not None and key_path is not None:
        ctx.load_cert_chain(cert_path, key_path)
    return ctx


def check_edge_certificate(der: bytes | None, cluster: str, address: str) -> None:
    """Refuse a verified peer whose certificate is not a server's of CLUSTER."""
    if der is None:
        raise EdgeUnavailable(f"edge {address} presented no certificate")
    identity = certs.identity_of(x509.load_der_x509_certificate(der))
    if identity.role != certs.Role.SERVER or identity.cluster != cluster:
        raise EdgeUnavailable(
            f"edge {address} presented a certificate of {identity.role or 'no role'} "
            f"{identity.name!r} in cluster {identity.cluster!r}, "
            f"not of a server of cluster {cluster!r}"
        )
