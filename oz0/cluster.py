"""The cluster row: its name, shard count and CAs, unsealed with the master key."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import psycopg
from cryptography.hazmat.primitives import hashes

from oz0 import pki
from oz0.errors import Oz0Error

log = logging.getLogger(__name__)

# Since schema 4, sealed secrets name what they are (pki.Sealed); 1 marks a cluster whose
# keys were sealed before and are re-sealed by the next `server start`.
SEAL_VERSION = 2


@dataclass(frozen=True)
class Cluster:
    name: str
    history_shards: int
    cluster_ca: pki.CertificateAuthority
    internode_ca: pki.CertificateAuthority

    # Worked out once: the edge greets every connection with them.
    @cached_property
    def ca_hash(self) -> str:
        return pki.ca_hash(self.cluster_ca.cert)

    @cached_property
    def ca_pem(self) -> bytes:
        return pki.cert_to_pem(self.cluster_ca.cert)

    @property
    def ca_fingerprint(self) -> str:
        """The CA certificate's SHA-256 as browsers and `openssl x509 -fingerprint` show it."""
        digest = self.cluster_ca.cert.fingerprint(hashes.SHA256())
        return ":".join(f"{byte:02X}" for byte in digest)


def load(conn: psycopg.Connection[Any], master_key: bytes) -> Cluster:
    """Unseal the cluster's CAs; WrongMasterKey names the cluster when the key is not its."""
    row = conn.execute(
        "SELECT name, history_shards, cluster_ca_cert, cluster_ca_key_sealed,"
        " internode_ca_cert, internode_ca_key_sealed, seal_version FROM cluster"
    ).fetchone()
    if row is None:
        raise Oz0Error("database holds no orchestrator-zero cluster; run `server init` first")
    name, shards, ca_cert, ca_key, inter_cert, inter_key, seal_version = row
    legacy = seal_version < SEAL_VERSION
    return Cluster(
        name=name,
        history_shards=shards,
        cluster_ca=pki.load_ca(
            ca_cert.encode(),
            bytes(ca_key),
            master_key,
            name,
            pki.Sealed.CLUSTER_CA_KEY,
            legacy=legacy,
        ),
        internode_ca=pki.load_ca(
            inter_cert.encode(),
            bytes(inter_key),
            master_key,
            name,
            pki.Sealed.INTERNODE_CA_KEY,
            legacy=legacy,
        ),
    )


def reseal_legacy(conn: psycopg.Connection[Any], master_key: bytes) -> bool:
    """Seal the CA keys again, bound to what each one is, if they were sealed before seal
    version 2; inside the caller's transaction. True if it re-sealed."""
    row = conn.execute("SELECT seal_version FROM cluster FOR UPDATE").fetchone()
    if row is None or row[0] >= SEAL_VERSION:
        return False
    cluster = load(conn, master_key)
    conn.execute(
        "UPDATE cluster SET cluster_ca_key_sealed = %s, internode_ca_key_sealed = %s,"
        " seal_version = %s",
        (
            cluster.cluster_ca.sealed_key(master_key, pki.Sealed.CLUSTER_CA_KEY),
            cluster.internode_ca.sealed_key(master_key, pki.Sealed.INTERNODE_CA_KEY),
            SEAL_VERSION,
        ),
    )
    log.info("re-sealed the CA keys of cluster %s, each bound to what it is", cluster.name)
    return True
