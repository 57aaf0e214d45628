from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from cli.client import ApiClient, expiry_warning, servers_of
from oz0 import pki
from oz0.context import Context, ContextError, check_address, select
from oz0.errors import Oz0Error


def make_context(
    directory: Path, cluster: str, *, not_after_in: dt.timedelta | None = None
) -> Context:
    ca = pki.new_ca(cluster, "cluster")
    key = pki.new_private_key()
    now = pki.utcnow()
    validity = not_after_in or pki.OPERATOR_VALIDITY
    cert = ca.issue(
        key.public_key(), name="admin", role=pki.Role.OPERATOR, validity=validity, now=now
    )
    context = Context(directory, cluster, "admin", ("127.0.0.11:8443",), pki.ca_hash(ca.cert))
    context.write_credentials(
        ca_pem=pki.cert_to_pem(ca.cert), cert_pem=pki.cert_to_pem(cert), key_pem=pki.key_to_pem(key)
    )
    return context


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "cfg"))
    monkeypatch.delenv("OZ0_CONTEXT", raising=False)
    return tmp_path / "cfg" / "orchestrator-zero"


def test_context_files_are_private(config_home: Path) -> None:
    context = make_context(config_home / "a", "a")
    assert context.directory.stat().st_mode & 0o777 == 0o700
    for path in context.directory.iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_the_only_context_is_chosen(config_home: Path) -> None:
    make_context(config_home / "a", "a")
    assert select().cluster == "a"


def test_no_context_is_an_error_naming_the_directory(config_home: Path) -> None:
    with pytest.raises(ContextError, match=f"no CLI context found in {config_home}"):
        select()


def test_several_contexts_are_listed(config_home: Path) -> None:
    make_context(config_home / "a", "a")
    make_context(config_home / "b", "b")
    with pytest.raises(ContextError) as raised:
        select()
    assert str(config_home / "a" / "context.json") in str(raised.value)
    assert str(config_home / "b" / "context.json") in str(raised.value)


def test_flag_chooses_among_several(config_home: Path) -> None:
    make_context(config_home / "a", "a")
    make_context(config_home / "b", "b")
    assert select(config_home / "b" / "context.json").cluster == "b"


def test_the_flag_comes_before_the_environment(
    config_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_context(config_home / "a", "a")
    make_context(config_home / "b", "b")
    elsewhere = make_context(tmp_path / "elsewhere", "e")
    monkeypatch.setenv("OZ0_CONTEXT", str(elsewhere.path))
    assert select().cluster == "e", "the variable before the contexts of the config directory"
    assert select(config_home / "a" / "context.json").cluster == "a", "--context before both"


def test_missing_context_file_is_a_clear_error(
    config_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OZ0_CONTEXT", "/nonexistent/context.json")
    with pytest.raises(ContextError, match=r"context /nonexistent/context\.json not found"):
        select()


def test_expiry_warning_below_15_days() -> None:
    now = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
    assert expiry_warning(now + dt.timedelta(days=15, seconds=1), now) is None
    warning = expiry_warning(now + dt.timedelta(days=14, hours=23), now)
    assert warning is not None and "expires in 14 days" in warning and "operator renew" in warning


def test_client_warns_on_stderr_by_the_injected_clock(
    config_home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    context = make_context(config_home / "a", "a")
    issued = pki.cert_from_pem(context.cert_path.read_bytes()).not_valid_after_utc
    ApiClient(context, now=lambda: issued - dt.timedelta(days=20))
    assert capsys.readouterr().err == ""
    ApiClient(context, now=lambda: issued - dt.timedelta(days=10))
    assert "warning: operator certificate expires in 10 days" in capsys.readouterr().err


def test_client_refuses_an_expired_certificate(config_home: Path) -> None:
    context = make_context(config_home / "a", "a")
    issued = pki.cert_from_pem(context.cert_path.read_bytes()).not_valid_after_utc
    with pytest.raises(Oz0Error, match=r"expired on .*server operator issue"):
        ApiClient(context, now=lambda: issued + dt.timedelta(seconds=1))


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("10.0.0.11", "10.0.0.11:8443"),
        ("10.0.0.11:9443", "10.0.0.11:9443"),
        ("lb.example.com", "lb.example.com:8443"),
        ("fd00::11", "[fd00::11]:8443"),
        ("[fd00::11]:9443", "[fd00::11]:9443"),
    ],
)
def test_server_addresses_take_a_default_port(given: str, address: str) -> None:
    assert check_address(given) == address


@pytest.mark.parametrize("given", ["", "a b", "x:0", "x:65536", "x:port", "-x", "a..b", "[::1"])
def test_bad_server_addresses_are_refused(given: str) -> None:
    with pytest.raises(ContextError, match="must be HOST or HOST:PORT"):
        check_address(given)


def test_learned_servers_are_kept_and_tried_after_the_written_ones(config_home: Path) -> None:
    context = make_context(config_home / "a", "a")
    assert Context.load(context.path).learned_at is None
    assert context.addresses == ("127.0.0.11:8443",)
    when = dt.datetime(2026, 6, 1, 12, 0, tzinfo=dt.UTC)
    context.with_learned(("10.0.0.12:8443", "127.0.0.11:8443"), when).save()
    loaded = Context.load(context.path)
    assert (loaded.learned, loaded.learned_at) == (("10.0.0.12:8443", "127.0.0.11:8443"), when)
    assert loaded.servers == ("127.0.0.11:8443",)
    assert loaded.addresses == ("127.0.0.11:8443", "10.0.0.12:8443")
    loaded.with_learned(("10.0.0.13:8443",), when).save()
    assert Context.load(context.path).addresses == ("127.0.0.11:8443", "10.0.0.13:8443")


def test_the_servers_up_are_read_from_the_cluster_answer() -> None:
    answer = {
        "servers": [
            {"advertise": "10.0.0.11"},
            {"advertise": "fd00::12"},
            {"advertise": "10.0.0.11"},
            {"advertise": "not an address"},
            {"advertise": 5},
            "junk",
        ]
    }
    assert servers_of(answer) == ("10.0.0.11:8443", "[fd00::12]:8443")
    assert servers_of({"servers": "x"}) == ()
    assert servers_of([]) == ()
