"""The search for a server's private key on disk (fixtures/keys.py) looks at every key it
meets, of whatever kind, without failing on one that cryptography warns about."""

from __future__ import annotations

import warnings
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fixtures.keys import _private_keys_in, assert_no_file_holds_key_of


def _dsa_pem() -> bytes:
    # Made where the suite's warnings are not errors: DSA itself is deprecated.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from cryptography.hazmat.primitives.asymmetric import dsa

        key = dsa.generate_private_key(1024)
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def test_a_dsa_key_among_the_files_searched_is_found_not_an_error(tmp_path: Path) -> None:
    # As a virtualenv's test fixtures under /tmp (libcloud's test_dsa.key in Salt's).
    (tmp_path / "venv").mkdir()
    (tmp_path / "venv" / "test_dsa.key").write_bytes(_dsa_pem())
    ours = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "server.key").write_bytes(
        ours.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert len(_private_keys_in(tmp_path)) == 2
    other = ec.generate_private_key(ec.SECP256R1()).public_key().public_numbers()
    assert_no_file_holds_key_of(other, [tmp_path])
