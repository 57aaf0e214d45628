"""The suite's scheduler keeps files naming one same loopback address in one scope."""

from __future__ import annotations

from tests.conftest import address_scopes


def test_files_sharing_an_address_directly_or_through_another_share_a_scope() -> None:
    ip = "127.0.0."
    scopes = address_scopes(
        {
            "tests/test_c.py": f"SERVER = '{ip}31'",
            "tests/test_a.py": f"A, B = '{ip}30', '{ip}40'",
            "tests/test_b.py": f"'{ip}40:7443' and the database on {ip}1:5432",
            "tests/test_d.py": f"the database on {ip}1:5432, a server on {ip}50",
            "tests/test_e.py": f"'{ip}31:8443'",
            "tests/test_f.py": "no address at all",
        }
    )
    assert scopes == {
        "tests/test_a.py": "tests/test_a.py",
        "tests/test_b.py": "tests/test_a.py",
        "tests/test_c.py": "tests/test_c.py",
        "tests/test_d.py": "tests/test_d.py",
        "tests/test_e.py": "tests/test_c.py",
        "tests/test_f.py": "tests/test_f.py",
    }


def test_a_longer_address_is_not_taken_for_its_prefix() -> None:
    ip = "127.0.0."
    scopes = address_scopes({"tests/test_a.py": f"{ip}11", "tests/test_b.py": f"{ip}111"})
    assert scopes["tests/test_b.py"] == "tests/test_b.py"
