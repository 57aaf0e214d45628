"""The cluster's sealed CA keys are bound to what each one is; clusters sealed before that
are re-sealed by the next server start."""

from __future__ import annotations

import os
from typing import Any

import psycopg
import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fixtures.cluster import ClusterFiles
from oz0 import cluster, pki
from oz0.errors import WrongMasterKey
from oz0.server import start as server_start


def _main(files: ClusterFiles) -> psycopg.Connection[Any]:
    return psycopg.connect(files.main_db)


def _seal_v1(master_key: bytes, plaintext: bytes, cluster_name: str) -> bytes:
    """As releases before schema 4 sealed: the cluster name alone as associated data."""
    nonce = os.urandom(12)
    return b"\x01" + nonce + AESGCM(master_key).encrypt(nonce, plaintext, cluster_name.encode())


def test_a_new_cluster_is_sealed_bound_to_purpose_and_a_swap_is_refused(
    cluster_files: ClusterFiles,
) -> None:
    master_key = pki.read_master_key(cluster_files.master_key)
    with _main(cluster_files) as conn:
        row = conn.execute(
            "SELECT seal_version, cluster_ca_key_sealed, internode_ca_key_sealed FROM cluster"
        ).fetchone()
        assert row is not None
        assert row[0] == 2 and bytes(row[1])[:1] == bytes(row[2])[:1] == b"\x02"
        conn.execute(
            "UPDATE cluster SET cluster_ca_key_sealed = internode_ca_key_sealed,"
            " internode_ca_key_sealed = cluster_ca_key_sealed"
        )
        with pytest.raises(WrongMasterKey, match="master key does not match cluster test"):
            cluster.load(conn, master_key)


def test_a_cluster_sealed_before_is_resealed_at_start_and_still_works(
    cluster_files: ClusterFiles,
) -> None:
    master_key = pki.read_master_key(cluster_files.master_key)
    with _main(cluster_files) as conn:
        before = cluster.load(conn, master_key)
        conn.execute(
            "UPDATE cluster SET seal_version = 1, cluster_ca_key_sealed = %s,"
            " internode_ca_key_sealed = %s",
            (
                _seal_v1(master_key, pki.key_to_pem(before.cluster_ca.key), before.name),
                _seal_v1(master_key, pki.key_to_pem(before.internode_ca.key), before.name),
            ),
        )
        # Until re-sealed, the old format still opens (the cluster is usable as it was).
        assert cluster.load(conn, master_key).ca_hash == before.ca_hash

    options = server_start.StartOptions(
        url=cluster_files.url, master_key_file=cluster_files.master_key, advertise="127.0.0.11"
    )
    after = server_start.prepare(options)
    assert after.ca_hash == before.ca_hash
    assert after.internode_ca.key.private_numbers() == before.internode_ca.key.private_numbers()
    with _main(cluster_files) as conn:
        row = conn.execute(
            "SELECT seal_version, cluster_ca_key_sealed, internode_ca_key_sealed FROM cluster"
        ).fetchone()
        assert row is not None and row[0] == 2
        assert bytes(row[1])[:1] == bytes(row[2])[:1] == b"\x02"
        # Re-sealed once: the next start has nothing to do.
        assert cluster.reseal_legacy(conn, master_key) is False


def test_a_wrong_master_key_reseals_nothing(cluster_files: ClusterFiles, tmp_path: Any) -> None:
    master_key = pki.read_master_key(cluster_files.master_key)
    with _main(cluster_files) as conn:
        loaded = cluster.load(conn, master_key)
        old = _seal_v1(master_key, pki.key_to_pem(loaded.cluster_ca.key), loaded.name)
        conn.execute("UPDATE cluster SET seal_version = 1, cluster_ca_key_sealed = %s", (old,))
    wrong = tmp_path / "wrong.key"
    pki.write_master_key(wrong)
    options = server_start.StartOptions(
        url=cluster_files.url, master_key_file=wrong, advertise="127.0.0.11"
    )
    with pytest.raises(WrongMasterKey):
        server_start.prepare(options)
    with _main(cluster_files) as conn:
        row = conn.execute("SELECT seal_version, cluster_ca_key_sealed FROM cluster").fetchone()
        assert row is not None and row[0] == 1 and bytes(row[1]) == old
