from __future__ import annotations

import threading
import time

import psycopg
import pytest
import trio

from fixtures.cluster import ClusterFiles
from oz0 import membership
from oz0.errors import SchemaMismatch
from oz0.store import migrations
from oz0.store.listen import ListenConnectionLost, Notification, listen
from oz0.store.pool import open_database
from tests.conftest import CliRunner


def start_args(files: ClusterFiles) -> list[str]:
    return [
        "server", "start", "--master-key-file", str(files.master_key), "--advertise", "127.0.0.11",
    ]  # fmt: skip


def _future(version: int, *, contract: bool = False) -> migrations.Migration:
    return migrations.Migration(
        version, f"future_{version}", f"CREATE TABLE future_{version} (x int);", contract
    )


def test_start_refuses_a_database_whose_oldest_server_schema_is_newer_than_it_knows(
    cli: CliRunner, cluster_files: ClusterFiles, cluster_env: dict[str, str]
) -> None:
    known = migrations.code_version()
    with psycopg.connect(cluster_files.main_db) as conn:
        # What a release of schema 99 leaves after a contract migration 95.
        conn.execute(
            "INSERT INTO oz0_schema (version, name, oldest_server) VALUES (99, 'future', 95)"
        )
    result = cli(*start_args(cluster_files), env=cluster_env)
    assert result.code == 1
    assert result.err == (
        f"error: database schema 99 needs servers of schema 95 or newer; this server knows "
        f"{known}: upgrade it\n"
    )
    # `server init --upgrade` refuses it alike, and writes nothing.
    upgraded = cli("server", "init", "--upgrade", env=cluster_env)
    assert (upgraded.code, upgraded.err) == (1, result.err)


def test_a_server_runs_beside_a_newer_database_whose_oldest_server_schema_it_meets(
    cluster_files: ClusterFiles,
) -> None:
    known = migrations.code_version()
    with psycopg.connect(cluster_files.main_db) as conn:
        conn.execute(
            "INSERT INTO oz0_schema (version, name, oldest_server) VALUES (%s, 'future', %s)",
            (known + 2, known),
        )
        assert migrations.apply(conn, [known + 2]) == migrations.Plan()
        migrations.check_current(conn)
        assert migrations.database_version(conn) == known + 2


def test_start_refuses_a_database_older_than_this_release_migrates_from(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = migrations.load()
    monkeypatch.setattr(migrations, "load", lambda: [*real, _future(len(real) + 1)])
    monkeypatch.setattr(migrations, "MIGRATES_FROM", len(real) + 1)
    result = cli(*start_args(cluster_files), env=cluster_env)
    assert result.code == 1
    assert result.err == (
        f"error: database schema {len(real)} is older than this release migrates from "
        f"(schema {len(real) + 1}); upgrade it with an earlier release first, then with "
        "this one\n"
    )
    with psycopg.connect(cluster_files.main_db) as conn:
        assert migrations.database_version(conn) == len(real)


def test_expand_migrations_apply_beside_older_servers_and_contract_ones_wait_for_them(
    cluster_files: ClusterFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = migrations.load()
    now = len(real)
    expand, contract = _future(now + 1), _future(now + 2, contract=True)
    monkeypatch.setattr(migrations, "load", lambda: [*real, expand, contract])
    with psycopg.connect(cluster_files.main_db) as conn:
        # What uses the database without migrating it (`server operator issue`) needs the
        # expand steps applied first.
        with pytest.raises(SchemaMismatch, match=f"database schema {now} is older than"):
            migrations.check_current(conn)
        # A server of this schema is up, and one of a release before servers said theirs.
        steps = migrations.apply(conn, [now, None])
        assert steps == migrations.Plan([expand], [contract])
        assert migrations.database_version(conn) == now + 1
        assert migrations.database_floor(conn) == migrations.floor_at(now, real)
        # The contract step waits; the code runs without it (contract steps only).
        migrations.check_current(conn)

        assert migrations.apply(conn, [now + 2]) == migrations.Plan([contract])
        assert migrations.database_version(conn) == now + 2
        table = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (contract.name,)).fetchone()
        assert table == (True,)
        assert migrations.database_floor(conn) == now + 2


def test_a_contract_step_and_an_older_server_registering_meanwhile_cannot_cross(
    cluster_files: ClusterFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = migrations.load()
    now = len(real)
    contract = _future(now + 1, contract=True)
    with psycopg.connect(cluster_files.main_db) as older:
        # A server of this schema registers (its start checked the schema a moment ago)...
        migrations.admit(older, now)
        older.execute(
            "INSERT INTO servers (id, advertise, version, schema_version)"
            " VALUES ('older', '127.0.0.11', 'test', %s)",
            (now,),
        )
        # ... while a newer server's start would apply a contract step: it waits for the
        # registration, then sees that server up, and the step waits for it.
        monkeypatch.setattr(migrations, "load", lambda: [*real, contract])
        newer: list[migrations.Plan] = []

        def start_newer() -> None:
            with psycopg.connect(cluster_files.main_db) as conn:
                newer.append(migrations.apply(conn, membership.live_schemas))

        thread = threading.Thread(target=start_newer)
        thread.start()
        time.sleep(0.5)
        assert thread.is_alive(), "the migration did not wait for the registration"
        older.commit()
        thread.join(30)
    assert newer == [migrations.Plan([], [contract])]

    # The other order: the step applied while no older server was up, and then one of them
    # registers (its start having checked before the step): refused.
    with psycopg.connect(cluster_files.main_db) as conn:
        conn.execute("DELETE FROM servers WHERE id = 'older'")
        assert migrations.apply(conn, membership.live_schemas) == migrations.Plan([contract])
    with psycopg.connect(cluster_files.main_db) as conn, pytest.raises(SchemaMismatch) as no:
        migrations.admit(conn, now)
    assert str(no.value) == (
        f"database schema {now + 1} needs servers of schema {now + 1} or newer; "
        f"this server knows {now}: upgrade it"
    )


def test_init_upgrade_applies_a_newer_release_s_migrations(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = migrations.load()
    future = _future(len(real) + 1)
    monkeypatch.setattr(migrations, "load", lambda: [*real, future])
    upgraded = cli("server", "init", "--upgrade", "--json", env=cluster_env)
    assert upgraded.code == 0, upgraded.err
    assert upgraded.json() == {"applied": [future.version]}
    with psycopg.connect(cluster_files.main_db) as conn:
        assert migrations.database_version(conn) == future.version
        table = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (future.name,)).fetchone()
        assert table == (True,)
    again = cli("server", "init", "--upgrade", env=cluster_env)
    assert again.out == "schema already up to date\n"


def test_migrations_are_numbered_without_gaps() -> None:
    versions = [m.version for m in migrations.load()]
    assert versions == list(range(1, len(versions) + 1))


def test_every_migration_declares_its_kind_expand_unless_its_header_says_contract() -> None:
    # Parsing every file is load()'s; these two change what earlier servers rely on.
    assert [m.version for m in migrations.load() if m.contract] == [4, 13]


def test_a_header_that_is_neither_expand_nor_contract_is_refused() -> None:
    assert migrations.kind_of("-- oz0: contract\nDROP TABLE t;") is True
    assert migrations.kind_of("-- oz0: expand\nCREATE TABLE t ();") is False
    assert migrations.kind_of("CREATE TABLE t ();") is False
    with pytest.raises(RuntimeError, match="is not a header"):
        migrations.kind_of("-- oz0: contact\nDROP TABLE t;")
    with pytest.raises(RuntimeError, match="is not a header"):
        migrations.kind_of("-- why\n-- oz0: contract\nDROP TABLE t;")


def test_a_contract_step_waits_for_every_older_server_and_an_expand_step_behind_it_refuses() -> (
    None
):
    one, two = _future(1), _future(2, contract=True)
    three = _future(3)
    known = [one, two, three]
    assert migrations.plan(1, 1, [], known) == migrations.Plan([two, three])
    assert migrations.plan(1, 1, [3], known) == migrations.Plan([two, three])
    with pytest.raises(SchemaMismatch) as refused:
        migrations.plan(1, 1, [3, 1], known)
    assert str(refused.value) == (
        "database schema 1: migration 3 waits behind contract migration 2, which servers of "
        "schema 1 still running cannot run beside; upgrade them first"
    )
    # A server of a release before servers said their schema counts as older than any.
    assert migrations.plan(1, 1, [None], [one, two]) == migrations.Plan([], [two])
    assert migrations.plan(2, 2, [None], known) == migrations.Plan([three])


async def test_listen_delivers_notifications(cluster_files: ClusterFiles) -> None:
    received: list[Notification] = []
    arrived = trio.Event()

    def on_notify(n: Notification) -> None:
        received.append(n)
        if len(received) == 2:
            arrived.set()

    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            await nursery.start(listen, cluster_files.main_db, ["oz0_test"], on_notify)
            async with open_database(cluster_files.main_db) as db:
                await db.transaction(lambda c: c.execute("NOTIFY oz0_test, 'one'"))
                await db.transaction(lambda c: c.execute("SELECT pg_notify('oz0_test', 'two')"))
            await arrived.wait()
            nursery.cancel_scope.cancel()
    assert received == [Notification("oz0_test", "one"), Notification("oz0_test", "two")]


async def test_a_lost_listen_connection_fails_loudly(cluster_files: ClusterFiles) -> None:
    with trio.fail_after(20), pytest.RaisesGroup(ListenConnectionLost, flatten_subgroups=True):
        async with trio.open_nursery() as nursery:
            await nursery.start(listen, cluster_files.main_db, ["oz0_test"], lambda n: None)
            async with open_database(cluster_files.main_db) as db:
                await db.transaction(
                    lambda c: c.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE application_name = 'oz0-listen'"
                    )
                )
            await trio.sleep_forever()
