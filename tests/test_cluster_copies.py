"""The test clusters copied from one `server init` (fixtures/cluster_copies.py): each copy
has databases and files of its own, as `initialise` leaves them, and names the address it
was asked for."""

from __future__ import annotations

from pathlib import Path

import psycopg

from fixtures.cluster import DEFAULT_ADVERTISE, ClusterFiles
from fixtures.cluster_copies import ClusterTemplate
from fixtures.postgres import fresh_database_url
from oz0.context import Context


def scalar(url: str, query: str) -> object:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    return row[0]


def test_a_copy_is_a_cluster_of_its_own_at_the_address_asked(
    cluster_files: ClusterFiles, cluster_template: ClusterTemplate, tmp_path: Path
) -> None:
    mine = cluster_files.url
    with psycopg.connect(mine.for_database(mine.names.main), autocommit=True) as conn:
        conn.execute("INSERT INTO tenants (name) VALUES ('only-in-the-first')")
    (tmp_path / "other").mkdir()
    with fresh_database_url() as url:
        other = cluster_template.copy(tmp_path / "other", url, advertise="127.0.0.1")
        tenants = "SELECT count(*) FROM tenants WHERE name = 'only-in-the-first'"
        assert scalar(url.for_database(url.names.main), tenants) == 0
        assert Context.load(other.context_path).servers == ("127.0.0.1:8443",)
        # Temporal's host reads its schema's version by its database's name.
        for name in (url.names.temporal, url.names.visibility):
            assert scalar(url.for_database(name), "SELECT db_name FROM schema_version") == name
    assert Context.load(cluster_files.context_path).servers == (f"{DEFAULT_ADVERTISE}:8443",)
    assert cluster_files.master_key.stat().st_mode & 0o777 == 0o600
    assert cluster_files.context_dir.stat().st_mode & 0o777 == 0o700
    assert (cluster_files.context_dir / "operator.key").stat().st_mode & 0o777 == 0o600
