from __future__ import annotations

import psycopg
import pytest
import trio

from fixtures.cluster import ClusterFiles
from oz0.store import migrations
from oz0.store.listen import ListenConnectionLost, Notification, listen
from oz0.store.pool import open_database
from tests.conftest import CliRunner


def main_db(files: ClusterFiles) -> str:
    return files.url.for_database(files.url.names.main)


def start_args(files: ClusterFiles) -> list[str]:
    return [
        "server", "start", "--master-key-file", str(files.master_key), "--advertise", "127.0.0.11",
    ]  # fmt: skip


def test_start_refuses_a_database_newer_than_the_code(
    cli: CliRunner, cluster_files: ClusterFiles, cluster_env: dict[str, str]
) -> None:
    with psycopg.connect(main_db(cluster_files)) as conn:
        conn.execute("INSERT INTO oz0_schema (version, name) VALUES (99, 'future')")
    result = cli(*start_args(cluster_files), env=cluster_env)
    assert result.code == 1
    assert result.err == (
        "error: database schema is at version 99, newer than this orchestrator-zero "
        f"(it knows up to version {migrations.code_version()}); install the newer release\n"
    )


def test_start_asks_for_upgrade_on_an_older_database_and_upgrade_applies_it(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = migrations.load()
    future = migrations.Migration(len(real) + 1, "future", "CREATE TABLE future_table (x int);")
    monkeypatch.setattr(migrations, "load", lambda: [*real, future])

    result = cli(*start_args(cluster_files), env=cluster_env)
    assert result.code == 1
    assert (
        f"schema is at version {len(real)}, this orchestrator-zero needs version {future.version}"
        in result.err
    )
    assert "server init --upgrade" in result.err

    upgraded = cli("server", "init", "--upgrade", "--json", env=cluster_env)
    assert upgraded.code == 0, upgraded.err
    assert upgraded.json() == {"applied": [future.version]}
    with psycopg.connect(main_db(cluster_files)) as conn:
        assert migrations.database_version(conn) == future.version
        assert conn.execute("SELECT to_regclass('future_table') IS NOT NULL").fetchone() == (True,)
    again = cli("server", "init", "--upgrade", env=cluster_env)
    assert again.out == "schema already up to date\n"


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [m.version for m in migrations.load()]
    assert versions == list(range(1, len(versions) + 1))


async def test_listen_delivers_notifications(cluster_files: ClusterFiles) -> None:
    received: list[Notification] = []
    arrived = trio.Event()

    def on_notify(n: Notification) -> None:
        received.append(n)
        if len(received) == 2:
            arrived.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(listen, main_db(cluster_files), ["oz0_test"], on_notify)
            async with open_database(main_db(cluster_files)) as db:
                await db.transaction(lambda c: c.execute("NOTIFY oz0_test, 'one'"))
                await db.transaction(lambda c: c.execute("SELECT pg_notify('oz0_test', 'two')"))
            await arrived.wait()
            nursery.cancel_scope.cancel()
    assert received == [Notification("oz0_test", "one"), Notification("oz0_test", "two")]


async def test_a_lost_listen_connection_fails_loudly(cluster_files: ClusterFiles) -> None:
    with trio.fail_after(20), pytest.RaisesGroup(ListenConnectionLost, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(listen, main_db(cluster_files), ["oz0_test"], lambda n: None)
            async with open_database(main_db(cluster_files)) as db:
                await db.transaction(
                    lambda c: c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = 'oz0-listen'"
                    )
                )
            await trio.sleep_forever()
