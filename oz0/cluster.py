"""The cluster row: its name, shard count and CAs, unsealed with the master key."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from oz0 import pki
from oz0.errors import Oz0Error


@dataclass(frozen=True)
class Cluster:
    name: str
    history_shards: int
    cluster_ca: pki.CertificateAuthority
    internode_ca: pki.CertificateAuthority

    @property
    def ca_hash(self) -> str:
        return pki.ca_hash(self.cluster_ca.cert)

    @property
    def ca_pem(self) -> bytes:
        return pki.cert_to_pem(self.cluster_ca.cert)


def load(conn: psycopg.Connection[Any], master_key: bytes) -> Cluster:
    """Unseal the cluster's CAs; WrongMasterKey names the cluster when the key is not its."""
    row = conn.execute(
        "SELECT name, history_shards, cluster_ca_cert, cluster_ca_key_sealed,"
        " internode_ca_cert, internode_ca_key_sealed FROM cluster"
    ).fetchone()
    if row is None:
        raise Oz0Error("database holds no orchestrator-zero cluster; run `server init` first")
    name, shards, ca_cert, ca_key, inter_cert, inter_key = row
    return Cluster(
        name=name,
        history_shards=shards,
        cluster_ca=pki.load_ca(ca_cert.encode(), bytes(ca_key), master_key, name),
        internode_ca=pki.load_ca(inter_cert.encode(), bytes(inter_key), master_key, name),
    )
