from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg
import pytest

from fixtures.postgres import admin_connection, database_exists, fresh_database_url, limited_role
from oz0 import cluster_init, operators, passwords, pki
from oz0.context import Context
from oz0.errors import Oz0Error
from oz0.store import databases, migrations
from oz0.store.dburl import DatabaseUrl
from tests.conftest import CliRunner


def init_plain(url: DatabaseUrl, tmp_path: Path) -> cluster_init.InitResult:
    return cluster_init.init_cluster(
        url,
        cluster_name="c",
        history_shards=4,
        master_key_out=tmp_path / "master.key",
        context_dir=tmp_path / "ctx",
    )


def init_args(tmp_path: Path, name: str = "prod-eu") -> list[str]:
    return [
        "server", "init", "--cluster-name", name, "--history-shards", "8",
        "--master-key-out", str(tmp_path / "master.key"),
    ]  # fmt: skip


def test_init_creates_everything_the_docs_name(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl
) -> None:
    result = cli(*init_args(tmp_path), "--json", env={"OZ0_DB": pg_url.conninfo})
    assert result.code == 0, result.err
    out = result.json()
    for name in pg_url.names.all():
        assert database_exists(name)
    assert pg_url.names.temporal == pg_url.names.main + "_temporal"
    assert pg_url.names.visibility == pg_url.names.main + "_temporal_visibility"

    key_file = tmp_path / "master.key"
    assert key_file.stat().st_mode & 0o777 == 0o600 and key_file.stat().st_size == 32

    context_dir = tmp_path / "config" / "orchestrator-zero" / "prod-eu"
    assert out["context"] == str(context_dir / "context.json")
    for f in ("context.json", "ca.crt", "operator.crt", "operator.key"):
        assert (context_dir / f).stat().st_mode & 0o777 == 0o600

    cert = pki.cert_from_pem((context_dir / "operator.crt").read_bytes())
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 90
    ca = pki.cert_from_pem((context_dir / "ca.crt").read_bytes())
    assert out["ca_hash"] == pki.ca_hash(ca)

    with psycopg.connect(pg_url.for_database(pg_url.names.main)) as conn:
        row = conn.execute("SELECT name, history_shards FROM cluster").fetchone()
        assert row == ("prod-eu", 8)
        assert conn.execute("SELECT name FROM tenants").fetchall() == [("default",)]
        assert operators.is_current(conn, pki.identity_of(cert))
        (stored,) = conn.execute(
            "SELECT password_hash FROM ui_accounts WHERE username = 'admin'"
        ).fetchone() or (None,)
        sealed = conn.execute("SELECT cluster_ca_key_sealed FROM cluster").fetchone()
        actions = [r[0] for r in conn.execute("SELECT action FROM audit_log ORDER BY id")]
    assert stored and out["ui_password"] not in stored
    assert passwords.verify(out["ui_password"], stored)
    assert not passwords.verify(out["ui_password"] + "x", stored)
    assert sealed and b"PRIVATE KEY" not in bytes(sealed[0])
    assert actions == ["cluster.init", "tenant.create", "operator.issue", "ui_account.create"]


def test_password_is_printed_once_for_people(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl
) -> None:
    result = cli(*init_args(tmp_path), env={"OZ0_DB": pg_url.conninfo})
    assert result.code == 0, result.err
    assert "web UI password:" in result.out
    assert "CA hash:          sha256:" in result.out


def test_init_twice_is_refused_and_changes_nothing(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl
) -> None:
    env = {"OZ0_DB": pg_url.conninfo}
    assert cli(*init_args(tmp_path), env=env).code == 0
    (tmp_path / "x").mkdir()
    again = cli(*init_args(tmp_path / "x", "other"), env=env)
    assert again.code == 1
    assert again.err == (
        f"error: database {pg_url.names.main} already holds cluster prod-eu; "
        "refusing to initialise it again\n"
    )
    assert not (tmp_path / "x" / "master.key").exists()
    with psycopg.connect(pg_url.for_database(pg_url.names.main)) as conn:
        assert conn.execute("SELECT count(*) FROM cluster").fetchone() == (1,)


def test_failure_midway_leaves_nothing_behind(
    tmp_path: Path, pg_url: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(operators, "issue_certificate", fail)
    context_dir = tmp_path / "config" / "c"
    with pytest.raises(RuntimeError, match="injected"):
        cluster_init.init_cluster(
            pg_url,
            cluster_name="c",
            history_shards=4,
            master_key_out=tmp_path / "master.key",
            context_dir=context_dir,
        )
    assert not (tmp_path / "master.key").exists()
    assert not context_dir.exists()
    assert list((tmp_path / "config").iterdir()) == []
    for name in pg_url.names.all():
        assert not database_exists(name)


def test_user_without_createdb_is_told_which_databases_to_create(tmp_path: Path) -> None:
    with limited_role(createdb=False) as role_url, fresh_database_url(role_url) as url:
        with pytest.raises(Oz0Error) as raised:
            init_plain(url, tmp_path)
        assert "may not create databases; create them first" in str(raised.value)
        assert ", ".join(url.names.all()) in str(raised.value)
        assert not (tmp_path / "master.key").exists()
        assert not database_exists(url.names.main)


def test_user_without_createdb_uses_empty_databases_made_for_it(tmp_path: Path) -> None:
    with limited_role(createdb=False) as role_url, fresh_database_url(role_url) as url:
        role = url.user
        with admin_connection() as admin:
            for name in url.names.all():
                admin.execute(f'CREATE DATABASE "{name}" OWNER "{role}"')
        result = init_plain(url, tmp_path)
        assert result.created_databases == ()
        with psycopg.connect(url.for_database(url.names.main)) as conn:
            assert migrations.database_version(conn) == migrations.code_version()


def test_non_empty_existing_database_is_refused(tmp_path: Path, pg_url: DatabaseUrl) -> None:
    with admin_connection() as admin:
        admin.execute(f'CREATE DATABASE "{pg_url.names.temporal}"')
    with psycopg.connect(pg_url.for_database(pg_url.names.temporal), autocommit=True) as conn:
        conn.execute("CREATE TABLE stray (x int)")
    with pytest.raises(Oz0Error, match=f"database {pg_url.names.temporal} is not empty"):
        init_plain(pg_url, tmp_path)
    assert not database_exists(pg_url.names.main)
    assert database_exists(pg_url.names.temporal)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cluster-name", "Prod EU"], "invalid cluster name 'Prod EU'"),
        (["--history-shards", "0"], "--history-shards must be between 1 and"),
    ],
)
def test_bad_arguments_get_one_line(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl, args: list[str], message: str
) -> None:
    base = init_args(tmp_path)
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[base.index(flag) + 1] = value
    result = cli(*base, env={"OZ0_DB": pg_url.conninfo})
    assert result.code == 1
    assert result.err.count("\n") == 1 and message in result.err
    assert not database_exists(pg_url.names.main)


def test_missing_oz0_db_is_one_line(
    cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OZ0_DB", raising=False)
    result = cli(*init_args(tmp_path))
    assert (result.code, result.err) == (
        1,
        "error: OZ0_DB is not set; set it to the cluster's PostgreSQL URL\n",
    )


class FakeVersionConnection:
    """Only what check_server_version reads; no PostgreSQL 12 or 17 runs here."""

    def __init__(self, num: int, shown: str) -> None:
        self.info = type("Info", (), {"server_version": num})()
        self._shown = shown

    def execute(self, query: str) -> Any:
        shown = self._shown
        return type("Cursor", (), {"fetchone": lambda self: (shown,)})()


@pytest.mark.parametrize(("num", "shown"), [(120015, "12.15"), (170002, "17.2 (Debian)")])
def test_unsupported_postgresql_versions_are_named(num: int, shown: str) -> None:
    with pytest.raises(
        Oz0Error, match=rf"PostgreSQL {shown.split()[0]}.* is not supported; .* 13 to 16"
    ):
        databases.check_server_version(FakeVersionConnection(num, shown))  # type: ignore[arg-type]


@pytest.mark.parametrize("num", [130000, 150018, 160002])
def test_supported_postgresql_versions_pass(num: int) -> None:
    assert databases.check_server_version(FakeVersionConnection(num, "x")) == num // 10000  # type: ignore[arg-type]


def test_init_points_the_context_at_the_advertised_server(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl
) -> None:
    env = {"OZ0_DB": pg_url.conninfo}
    bad = cli(*init_args(tmp_path), "--advertise", "10.0.0.11:99999", env=env)
    assert (bad.code, bad.err) == (
        1,
        "error: --advertise must be HOST or HOST:PORT of a server (an IP address or a name), "
        "not '10.0.0.11:99999'\n",
    )
    assert not (tmp_path / "master.key").exists()
    assert not database_exists(pg_url.names.main)
    result = cli(*init_args(tmp_path), "--advertise", "10.0.0.11", "--json", env=env)
    assert result.code == 0, result.err
    assert Context.load(Path(result.json()["context"])).servers == ("10.0.0.11:8443",)
