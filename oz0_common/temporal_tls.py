"""A Temporal client's mutual TLS from the files of an identity (a node's data directory,
an operator's context): the cluster CA, then the certificate and key it presents."""

from __future__ import annotations

from pathlib import Path

from temporalio.service import TLSConfig


def tls_from_files(ca_path: Path, cert_path: Path, key_path: Path) -> TLSConfig:
    """OSError when a file cannot be read."""
    return TLSConfig(
        server_root_ca_cert=ca_path.read_bytes(),
        client_cert=cert_path.read_bytes(),
        client_private_key=key_path.read_bytes(),
    )
