from __future__ import annotations

import datetime as dt
import os
import subprocess
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from oz0 import pki
from oz0.errors import MasterKeyError, WrongMasterKey


def test_master_key_file_is_32_random_bytes_mode_0600(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    key = pki.write_master_key(path)
    assert len(key) == 32
    assert path.read_bytes() == key
    assert path.stat().st_mode & 0o777 == 0o600
    assert pki.read_master_key(path) == key
    assert pki.write_master_key(tmp_path / "other.key") != key


def test_master_key_is_never_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "master.key"
    key = pki.write_master_key(path)
    with pytest.raises(MasterKeyError, match="refusing to overwrite"):
        pki.write_master_key(path)
    assert path.read_bytes() == key


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_master_key_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = tmp_path / "master.key"
    pki.write_master_key(path)
    path.chmod(mode)
    with pytest.raises(MasterKeyError, match=f"mode {mode:04o}.*chmod 600"):
        pki.read_master_key(path)


def test_missing_master_key_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MasterKeyError, match="not found"):
        pki.read_master_key(tmp_path / "absent.key")


@pytest.mark.parametrize("size", [0, 31, 33, 64])
def test_corrupt_master_key_is_refused(tmp_path: Path, size: int) -> None:
    path = tmp_path / "master.key"
    path.write_bytes(os.urandom(size))
    path.chmod(0o600)
    with pytest.raises(MasterKeyError, match="not a master key"):
        pki.read_master_key(path)


CA_KEY, INTERNODE_KEY = pki.Sealed.CLUSTER_CA_KEY, pki.Sealed.INTERNODE_CA_KEY


def test_seal_binds_the_cluster_name_what_it_is_and_the_key() -> None:
    key, other = os.urandom(32), os.urandom(32)
    sealed = pki.seal(key, b"secret", "prod-eu", CA_KEY)
    assert b"secret" not in sealed
    assert pki.unseal(key, sealed, "prod-eu", CA_KEY) == b"secret"
    with pytest.raises(WrongMasterKey, match="master key does not match cluster prod-eu"):
        pki.unseal(other, sealed, "prod-eu", CA_KEY)
    with pytest.raises(WrongMasterKey):
        pki.unseal(key, sealed, "prod-us", CA_KEY)
    # One sealed secret cannot stand in for another of the same cluster.
    with pytest.raises(WrongMasterKey, match="master key does not match cluster prod-eu"):
        pki.unseal(key, sealed, "prod-eu", INTERNODE_KEY)
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(WrongMasterKey):
        pki.unseal(key, tampered, "prod-eu", CA_KEY)


def test_version_1_seals_open_only_as_legacy() -> None:
    key = os.urandom(32)
    nonce = os.urandom(12)
    legacy = b"\x01" + nonce + AESGCM(key).encrypt(nonce, b"secret", b"prod-eu")
    assert pki.unseal(key, legacy, "prod-eu", CA_KEY, legacy=True) == b"secret"
    with pytest.raises(WrongMasterKey, match="unknown format"):
        pki.unseal(key, legacy, "prod-eu", CA_KEY)


def test_ca_is_p256_and_reloads_from_its_sealed_key() -> None:
    ca = pki.new_ca("prod-eu", "cluster")
    assert ca.key.curve.name == "secp256r1"
    constraints = ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca
    master = os.urandom(32)
    pem = pki.cert_to_pem(ca.cert)
    loaded = pki.load_ca(pem, ca.sealed_key(master, CA_KEY), master, "prod-eu", CA_KEY)
    assert loaded.key.private_numbers() == ca.key.private_numbers()
    with pytest.raises(WrongMasterKey, match="prod-eu"):
        pki.load_ca(pem, ca.sealed_key(master, CA_KEY), os.urandom(32), "prod-eu", CA_KEY)


def test_ca_hash_is_sha256_of_the_spki_as_openssl_computes_it(tmp_path: Path) -> None:
    ca = pki.new_ca("prod-eu", "cluster")
    cert_file = tmp_path / "ca.crt"
    cert_file.write_bytes(pki.cert_to_pem(ca.cert))
    pubkey = subprocess.run(
        ["openssl", "x509", "-in", str(cert_file), "-pubkey", "-noout"],
        check=True,
        capture_output=True,
    ).stdout
    der = subprocess.run(
        ["openssl", "pkey", "-pubin", "-outform", "DER"],
        input=pubkey,
        check=True,
        capture_output=True,
    ).stdout
    digest = subprocess.run(
        ["openssl", "dgst", "-sha256", "-r"], input=der, check=True, capture_output=True
    ).stdout.split()[0]
    assert pki.ca_hash(ca.cert) == "sha256:" + digest.decode()


def test_issued_certificate_names_role_and_holder_and_verifies_against_the_ca() -> None:
    ca = pki.new_ca("prod-eu", "cluster")
    key = pki.new_private_key()
    now = pki.utcnow().replace(microsecond=0)
    cert = ca.issue(
        key.public_key(),
        name="server-abc",
        role=pki.Role.SERVER,
        validity=pki.SERVER_VALIDITY,
        sans=["10.0.0.11", "edge.example.com"],
        server=True,
        now=now,
    )
    cert.verify_directly_issued_by(ca.cert)
    identity = pki.identity_of(cert)
    assert (identity.role, identity.name, identity.cluster) == ("server", "server-abc", "prod-eu")
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.11"]
    assert sans.get_values_for_type(x509.DNSName) == ["edge.example.com"]
    assert cert.not_valid_after_utc - now == pki.SERVER_VALIDITY


def test_operator_certificate_lasts_90_days() -> None:
    ca = pki.new_ca("c", "cluster")
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    cert = ca.issue(
        pki.new_private_key().public_key(),
        name="admin",
        role=pki.Role.OPERATOR,
        validity=pki.OPERATOR_VALIDITY,
        now=now,
    )
    assert cert.not_valid_after_utc == now + dt.timedelta(days=90)


def test_csr_with_a_bad_signature_or_another_curve_is_refused() -> None:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    good = pki.make_csr(pki.new_private_key(), "admin").public_bytes(serialization.Encoding.PEM)
    assert isinstance(pki.csr_public_key(good), ec.EllipticCurvePublicKey)
    p384 = pki.make_csr(ec.generate_private_key(ec.SECP384R1()), "admin")
    with pytest.raises(ValueError, match="P-256"):
        pki.csr_public_key(p384.public_bytes(serialization.Encoding.PEM))
