"""`server init`: create a cluster, or leave nothing behind when that fails."""

from __future__ import annotations

import logging
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from oz0 import audit, membership, operators, passwords, pki, tenants
from oz0.context import CONTEXT_FILE, Context, server_address
from oz0.errors import Oz0Error
from oz0.store import databases, migrations
from oz0.store.dburl import DatabaseUrl
from oz0.temporal import host as temporal_host
from oz0.temporal.host import TemporalStores

log = logging.getLogger(__name__)

_CLUSTER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
MAX_HISTORY_SHARDS = 16384
INIT_ACTOR = audit.Actor("server", "server-init")
FIRST_OPERATOR = "admin"
FIRST_UI_ACCOUNT = "admin"
DEFAULT_TENANT = "default"


@dataclass(frozen=True)
class InitResult:
    cluster: str
    ca_hash: str
    ui_password: str
    context_path: Path
    created_databases: tuple[str, ...]


def check_cluster_name(name: str) -> str:
    if not _CLUSTER_NAME.fullmatch(name):
        raise Oz0Error(
            f"invalid cluster name {name!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    return name


def init_cluster(
    url: DatabaseUrl,
    *,
    cluster_name: str,
    history_shards: int,
    master_key_out: Path,
    context_dir: Path,
    advertise: str = "127.0.0.1",
    visibility_sqlite: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> InitResult:
    check_cluster_name(cluster_name)
    if not 1 <= history_shards <= MAX_HISTORY_SHARDS:
        raise Oz0Error(f"--history-shards must be between 1 and {MAX_HISTORY_SHARDS}")
    if master_key_out.exists():
        raise Oz0Error(f"{master_key_out} already exists; refusing to overwrite a master key")
    if not master_key_out.parent.is_dir():
        raise Oz0Error(f"directory {master_key_out.parent} does not exist")

    names = url.names
    with databases.maintenance_connection(url) as admin:
        major = databases.check_server_version(admin)
        _refuse_initialised(url)
        if (context_dir / CONTEXT_FILE).exists():
            raise Oz0Error(f"{context_dir / CONTEXT_FILE} already exists; move it away first")
        present = databases.existing(admin, names.all())
        missing = [n for n in names.all() if n not in present]
        if missing and not databases.may_create_databases(admin):
            raise Oz0Error(
                f"user {url.user} may not create databases; create them first (owned by "
                f"{url.user}, empty): {', '.join(missing)}"
            )
        for name in present:
            _refuse_non_empty(url, name)

        progress(f"PostgreSQL {major} at {url.redacted()}")
        created: list[str] = []
        temporal_touched = False
        key_written = False
        staging: Path | None = None
        try:
            for name in missing:
                databases.create(admin, name)
                created.append(name)
                progress(f"created database {name}")
            temporal_touched = True
            _report_temporal_schema(
                temporal_host.setup_schema(TemporalStores(url, visibility_sqlite)), progress
            )

            ui_password = passwords.generate()
            cluster_ca = pki.new_ca(cluster_name, "cluster")
            internode_ca = pki.new_ca(cluster_name, "internode")
            operator_key = pki.new_private_key()

            master_key = pki.write_master_key(master_key_out)
            key_written = True
            progress(f"wrote master key {master_key_out}")

            context_dir.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(dir=context_dir.parent, prefix=".init-"))
            with databases.connect(url.for_database(names.main)) as conn, conn.transaction():
                migrations.apply(conn)
                _insert_cluster(
                    conn, cluster_name, history_shards, master_key, cluster_ca, internode_ca
                )
                cert = operators.issue_certificate(
                    conn,
                    cluster_ca,
                    FIRST_OPERATOR,
                    operator_key.public_key(),
                    actor=INIT_ACTOR,
                    action="operator.issue",
                )
                conn.execute(
                    "INSERT INTO ui_accounts (username, password_hash) VALUES (%s, %s)",
                    (FIRST_UI_ACCOUNT, passwords.hash_password(ui_password)),
                )
                audit.record(conn, INIT_ACTOR, "ui_account.create", f"ui:{FIRST_UI_ACCOUNT}")
                context = Context(
                    directory=staging,
                    cluster=cluster_name,
                    operator=FIRST_OPERATOR,
                    servers=(server_address(advertise),),
                    ca_hash=pki.ca_hash(cluster_ca.cert),
                )
                context.write_credentials(
                    ca_pem=pki.cert_to_pem(cluster_ca.cert),
                    cert_pem=pki.cert_to_pem(cert),
                    key_pem=pki.key_to_pem(operator_key),
                )
                # The credentials reach their place before the commit: a failure after
                # this point rolls the database back and the files are removed below.
                staging.replace(context_dir)
                staging = context_dir
            progress("applied migrations and created the cluster's CAs, tenant and operator")
        except BaseException:
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            if key_written:
                master_key_out.unlink(missing_ok=True)
            for name in created:
                try:
                    databases.drop(admin, name)
                except psycopg.Error as e:
                    log.error("could not drop database %s after a failed init: %s", name, e)
            if temporal_touched:
                for name in (names.temporal, names.visibility):
                    if name in present:
                        _empty_again(url, name)
            raise

    return InitResult(
        cluster=cluster_name,
        ca_hash=pki.ca_hash(cluster_ca.cert),
        ui_password=ui_password,
        context_path=context_dir / CONTEXT_FILE,
        created_databases=tuple(created),
    )


def upgrade(
    url: DatabaseUrl,
    *,
    visibility_sqlite: Path | None = None,
    progress: Callable[[str], None] = lambda _: None,
) -> list[int]:
    """Apply the migrations a newer release brings, ours and Temporal's."""
    with databases.connect(url.for_database(url.names.main)) as conn:
        databases.check_server_version(conn)
        if migrations.database_version(conn) == 0:
            raise Oz0Error(
                f"database {url.names.main} holds no cluster; run `server init` without --upgrade"
            )
        with conn.transaction():
            # Beside the servers up now, as a server starting would (oz0/store/migrations.py).
            steps = migrations.apply(conn, membership.live_schemas)
    _report_temporal_schema(
        temporal_host.setup_schema(TemporalStores(url, visibility_sqlite)), progress
    )
    if steps.waiting:
        progress(
            f"contract migrations {[m.version for m in steps.waiting]} wait until no server of "
            "an earlier schema is up; run this again then"
        )
    return [m.version for m in steps.apply]


def _report_temporal_schema(changes: list[dict[str, Any]], progress: Callable[[str], None]) -> None:
    for change in changes:
        progress(
            f"Temporal schema of {change.get('database')}: "
            f"{change.get('from') or 'none'} -> {change.get('to')}"
        )


def _empty_again(url: DatabaseUrl, name: str) -> None:
    """Give back a database the user made for us as empty as we found it."""
    try:
        with databases.connect(url.for_database(name), autocommit=True) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
    except (psycopg.Error, Oz0Error) as e:
        log.error("could not empty database %s after a failed init: %s", name, e)


def _refuse_initialised(url: DatabaseUrl) -> None:
    try:
        conn = databases.connect(url.for_database(url.names.main))
    except Oz0Error:
        return  # absent or not reachable yet; creating it decides
    with conn:
        if migrations.database_version(conn) == 0:
            return
        row = conn.execute("SELECT name FROM cluster").fetchone()
        held = f"cluster {row[0]}" if row else "an orchestrator-zero schema"
        raise Oz0Error(
            f"database {url.names.main} already holds {held}; refusing to initialise it again"
        )


def _refuse_non_empty(url: DatabaseUrl, name: str) -> None:
    with databases.connect(url.for_database(name)) as conn:
        tables = databases.user_tables(conn)
    if tables:
        raise Oz0Error(
            f"database {name} is not empty (it has {', '.join(tables)}); use an empty one"
        )


def _insert_cluster(
    conn: psycopg.Connection[Any],
    name: str,
    history_shards: int,
    master_key: bytes,
    cluster_ca: pki.CertificateAuthority,
    internode_ca: pki.CertificateAuthority,
) -> None:
    conn.execute(
        "INSERT INTO cluster (name, history_shards, cluster_ca_cert, cluster_ca_key_sealed,"
        " internode_ca_cert, internode_ca_key_sealed, seal_version)"
        " VALUES (%s, %s, %s, %s, %s, %s, 2)",
        (
            name,
            history_shards,
            pki.cert_to_pem(cluster_ca.cert).decode(),
            cluster_ca.sealed_key(master_key, pki.Sealed.CLUSTER_CA_KEY),
            pki.cert_to_pem(internode_ca.cert).decode(),
            internode_ca.sealed_key(master_key, pki.Sealed.INTERNODE_CA_KEY),
        ),
    )
    audit.record(
        conn,
        INIT_ACTOR,
        "cluster.init",
        f"cluster:{name}",
        {"history_shards": history_shards, "ca_hash": pki.ca_hash(cluster_ca.cert)},
    )
    tenants.create(conn, DEFAULT_TENANT, INIT_ACTOR)
