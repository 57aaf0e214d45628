"""Jobs' secret environment on the server's side: sealed at rest, sealed again to the node.

- At rest: each value sealed with the master key as the CAs are (pki.Sealed.JOB_SECRET),
  its associated data naming the cluster, the job and the name, so a sealed value cannot be
  moved to another job or name; in `job_secrets`, never read by any listing. The job's row
  and audit entry hold the names only.
- At placement: the server unseals the values and seals them to the placed node's key (its
  certificate's, as the database holds it now) for that one attempt
  (oz0_common/sealed_env.py); that string is all Temporal's history ever holds of them.
- At the end: `store.finish` (and a cancellation before any workflow) delete the rows in
  the transaction that ends the job.

A running server holds the master key (`Cluster.master_key`); one without it can neither
take a job with secrets nor place one: it says so (SecretsUnavailable) rather than guess.
"""

from __future__ import annotations

from typing import Any

import psycopg
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import pki
from oz0.cluster import Cluster
from oz0.errors import WrongMasterKey
from oz0.jobs.spec import JobError
from oz0_common import sealed_env

Conn = psycopg.Connection[Any]


class SecretsUnavailable(JobError):
    """This server cannot keep or hand over a job's secrets: the message says why (never a
    value)."""


class SecretKeeper:
    """Seals and unseals jobs' secret values with the cluster's master key."""

    def __init__(self, cluster_name: str, master_key: bytes | None) -> None:
        self.cluster_name = cluster_name
        self._master_key = master_key

    def __repr__(self) -> str:  # never the key
        return f"SecretKeeper({self.cluster_name!r})"

    @classmethod
    def of(cls, cluster: Cluster) -> SecretKeeper:
        return cls(cluster.name, cluster.master_key)

    def _key(self) -> bytes:
        if self._master_key is None:
            raise SecretsUnavailable(
                "this server does not hold the cluster's master key: it cannot keep or hand"
                " over a job's secrets"
            )
        return self._master_key

    def seal(self, job_id: str, name: str, value: str) -> bytes:
        return pki.seal(
            self._key(),
            value.encode(),
            self.cluster_name,
            pki.Sealed.JOB_SECRET,
            bound=(job_id, name),
        )

    def unseal(self, job_id: str, name: str, sealed: bytes) -> str:
        try:
            plain = pki.unseal(
                self._key(),
                sealed,
                self.cluster_name,
                pki.Sealed.JOB_SECRET,
                bound=(job_id, name),
            )
        except WrongMasterKey:
            raise SecretsUnavailable(
                f"job {job_id}'s secret {name} does not unseal with this server's master key"
                " (sealed for another job, name or cluster?)"
            ) from None
        return plain.decode()


def keep(conn: Conn, keeper: SecretKeeper | None, job_id: str, values: dict[str, str]) -> None:
    """Seal VALUES for JOB_ID into job_secrets, in the transaction that makes the job."""
    if not values:
        return
    if keeper is None:
        raise SecretsUnavailable("this server cannot keep a job's secrets")
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO job_secrets (job_id, name, sealed) VALUES (%s, %s, %s)",
            [(job_id, name, keeper.seal(job_id, name, value)) for name, value in values.items()],
        )


def forget(conn: Conn, job_id: str) -> None:
    """The job has ended: its secrets go, in the transaction that ends it."""
    conn.execute("DELETE FROM job_secrets WHERE job_id = %s", (job_id,))


def for_attempt(
    conn: Conn, keeper: SecretKeeper | None, job_id: str, number: int, node_id: str
) -> str:
    """The job's secrets sealed to NODE_ID's current key for attempt NUMBER (the attempt's
    `secrets` field); "" for a job without secrets. SecretsUnavailable if they cannot be."""
    row = conn.execute("SELECT secret_env FROM jobs WHERE id = %s", (job_id,)).fetchone()
    names = list(row[0]) if row else []
    if not names:
        return ""
    if keeper is None:
        raise SecretsUnavailable("this server cannot hand over a job's secrets")
    rows = conn.execute(
        "SELECT name, sealed FROM job_secrets WHERE job_id = %s", (job_id,)
    ).fetchall()
    if sorted(r[0] for r in rows) != sorted(names):
        raise SecretsUnavailable(f"job {job_id}'s secrets are no longer kept (has it ended?)")
    values = {name: keeper.unseal(job_id, name, bytes(sealed)) for name, sealed in rows}
    return sealed_env.seal(
        _node_key(conn, node_id), values, job_id=job_id, attempt=number, node_id=node_id
    )


def _node_key(conn: Conn, node_id: str) -> ec.EllipticCurvePublicKey:
    """NODE_ID's key as its current certificate holds it (a renewal replaces both)."""
    row = conn.execute("SELECT certificate FROM nodes WHERE id = %s", (node_id,)).fetchone()
    if row is None or not row[0]:
        raise SecretsUnavailable(f"node {node_id} has no certificate to seal the secrets to")
    key = pki.cert_from_pem(str(row[0]).encode()).public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise SecretsUnavailable(f"node {node_id}'s certificate holds no P-256 key")
    return key
