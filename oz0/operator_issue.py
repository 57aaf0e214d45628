"""`server operator issue`: new operator credentials from the database and master key alone."""

from __future__ import annotations

import platform
from dataclasses import dataclass
from pathlib import Path

from oz0 import audit, operators, pki
from oz0 import cluster as cluster_mod
from oz0.context import CONTEXT_FILE, Context, server_address
from oz0.errors import Oz0Error
from oz0.store import databases, migrations
from oz0.store.dburl import DatabaseUrl


@dataclass(frozen=True)
class Issued:
    context: Context
    not_after: str


def issue_operator(
    url: DatabaseUrl,
    *,
    master_key_file: Path,
    name: str,
    operator_dir: Path,
    advertise: str | None,
) -> Issued:
    operators.check_name(name)
    master_key = pki.read_master_key(master_key_file)
    existing = Context.load(operator_dir) if (operator_dir / CONTEXT_FILE).exists() else None
    if existing is None and not advertise:
        raise Oz0Error(
            f"{operator_dir} holds no context yet; pass --advertise with a server address"
        )
    with databases.connect(url.for_database(url.names.main)) as conn:
        databases.check_server_version(conn)
        migrations.check_current(conn)
        cluster = cluster_mod.load(conn, master_key)
        if existing is not None and existing.cluster != cluster.name:
            raise Oz0Error(
                f"{operator_dir} holds a context of cluster {existing.cluster}, not {cluster.name}"
            )
        context = Context(
            directory=operator_dir,
            cluster=cluster.name,
            operator=name,
            servers=existing.servers if existing else (server_address(advertise or ""),),
            ca_hash=cluster.ca_hash,
            learned=existing.learned if existing else (),
            learned_at=existing.learned_at if existing else None,
        )
        key = pki.new_private_key()
        with conn.transaction():
            cert = operators.issue_certificate(
                conn,
                cluster.cluster_ca,
                name,
                key.public_key(),
                actor=audit.Actor("server", f"local:{platform.node()}"),
                action="operator.issue",
            )
            context.write_credentials(
                ca_pem=cluster.ca_pem,
                cert_pem=pki.cert_to_pem(cert),
                key_pem=pki.key_to_pem(key),
            )
    return Issued(context=context, not_after=cert.not_valid_after_utc.isoformat())
