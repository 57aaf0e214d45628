"""A Temporal client's mutual TLS: the cluster CA, then the certificate and key it presents,
as PEM held in memory (a server's own) or read from the files of an identity (a node's
data directory, an operator's context)."""

from __future__ import annotations

from pathlib import Path

from temporalio.service import TLSConfig


def tls_from_pems(ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> TLSConfig:
    return TLSConfig(server_root_ca_cert=ca_pem, client_cert=cert_pem, client_private_key=key_pem)


def tls_from_files(ca_path: Path, cert_path: Path, key_path: Path) -> TLSConfig:
    """OSError when a file cannot be read."""
    return tls_from_pems(ca_path.read_bytes(), cert_path.read_bytes(), key_path.read_bytes())
