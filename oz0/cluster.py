"""The cluster row: its name, shard count and CAs, unsealed with the master key.

Three CAs: the cluster CA (every certificate the API, the edge and Temporal verify), the
internode CA (Temporal's servers among themselves) and the web UI's CA (`ui_ca`), the only
one a browser is asked to trust. The UI CA signs nothing but the web UI's certificates and
no server verifies anything against it; critical name constraints hold it to the names the
cluster's servers advertise (`pki.ui_name_constraints`), so trusting it in a browser lets
whoever holds its key (or the master key) impersonate the cluster's own servers to you,
and no other site. The cluster CA has no such constraints (nodes and operators reach
servers by whatever address they were given), which is why it is never to be trusted in a
browser.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from oz0 import audit, pki
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
    # None until a server of this release started (`ensure_ui_ca`).
    ui_ca: pki.CertificateAuthority | None = None
    # Kept by a running server (as the CA keys it unsealed are) to seal and unseal jobs'
    # secrets (oz0/jobs/secret_env.py); None where the cluster was made without it.
    master_key: bytes | None = field(default=None, repr=False, compare=False)

    # Worked out once: the edge greets every connection with them.
    @cached_property
    def ca_hash(self) -> str:
        return pki.ca_hash(self.cluster_ca.cert)

    @cached_property
    def ca_pem(self) -> bytes:
        return pki.cert_to_pem(self.cluster_ca.cert)

    @cached_property
    def ui_ca_pem(self) -> bytes:
        """The UI CA's certificate: what `/ca.pem` serves for browsers to trust."""
        if self.ui_ca is None:
            raise Oz0Error(f"cluster {self.name} has no web UI CA yet; start a server first")
        return pki.cert_to_pem(self.ui_ca.cert)

    @property
    def ui_ca_fingerprint(self) -> str:
        """The UI CA certificate's SHA-256, as browsers show it (the sign-in page shows it)."""
        if self.ui_ca is None:
            return ""
        return _fingerprint(self.ui_ca.cert)


def _fingerprint(cert: x509.Certificate) -> str:
    return ":".join(f"{byte:02X}" for byte in cert.fingerprint(hashes.SHA256()))


def load(conn: psycopg.Connection[Any], master_key: bytes) -> Cluster:
    """Unseal the cluster's CAs; WrongMasterKey names the cluster when the key is not its."""
    row = conn.execute(
        "SELECT name, history_shards, cluster_ca_cert, cluster_ca_key_sealed,"
        " internode_ca_cert, internode_ca_key_sealed, seal_version, ui_ca_cert,"
        " ui_ca_key_sealed FROM cluster"
    ).fetchone()
    if row is None:
        raise Oz0Error("database holds no orchestrator-zero cluster; run `server init` first")
    name, shards, ca_cert, ca_key, inter_cert, inter_key, seal_version, ui_cert, ui_key = row
    legacy = seal_version < SEAL_VERSION
    ui_ca = None
    if ui_cert is not None:
        # Made after seal version 2: never sealed the old way.
        ui_ca = pki.load_ca(ui_cert.encode(), bytes(ui_key), master_key, name, pki.Sealed.UI_CA_KEY)
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
        ui_ca=ui_ca,
        master_key=master_key,
    )


def ensure_ui_ca(conn: psycopg.Connection[Any], master_key: bytes, names: Iterable[str]) -> bool:
    """Make the cluster's web UI CA if it has none, inside the caller's transaction; True if
    it made one.

    Its name constraints permit NAMES (the starting server's --advertise and --san) and the
    address of every server the cluster has on record, so that a cluster upgraded while its
    servers run covers all of them. They are fixed from then on: a browser that trusts the
    CA keeps trusting exactly that certificate, so widening them would mean trusting a new
    one. The row is locked: two servers starting at once make one CA, not two.
    """
    row = conn.execute("SELECT name, ui_ca_cert FROM cluster FOR UPDATE").fetchone()
    if row is None or row[1] is not None:
        return False
    name = row[0]
    known = [r[0] for r in conn.execute("SELECT advertise FROM servers ORDER BY started_at")]
    permitted = [*names, *known]
    ui_ca = pki.new_ui_ca(name, permitted)
    conn.execute(
        "UPDATE cluster SET ui_ca_cert = %s, ui_ca_key_sealed = %s",
        (pki.cert_to_pem(ui_ca.cert).decode(), ui_ca.sealed_key(master_key, pki.Sealed.UI_CA_KEY)),
    )
    audit.record(
        conn,
        audit.Actor("server", "server-start"),
        "cluster.ui_ca.create",
        f"cluster:{name}",
        {"names": list(dict.fromkeys(permitted)), "fingerprint": _fingerprint(ui_ca.cert)},
    )
    log.info(
        "made the web UI CA of cluster %s, good only for %s",
        name,
        ", ".join(dict.fromkeys(permitted)),
    )
    return True


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
