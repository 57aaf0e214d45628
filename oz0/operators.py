"""Operators: who may use the management API, each with exactly one valid certificate."""

from __future__ import annotations

import datetime as dt
import re
from typing import Any

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import access, audit, pki
from oz0.errors import Oz0Error

_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,62}$")


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise Oz0Error(
            f"invalid operator name {name!r}: use 1 to 63 lowercase letters, digits, '.', '_' "
            "or '-', starting with a letter or digit"
        )
    return name


def issue_certificate(
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    name: str,
    public_key: ec.EllipticCurvePublicKey,
    *,
    actor: audit.Actor,
    action: str,
    now: dt.datetime | None = None,
) -> x509.Certificate:
    """Sign a 90-day certificate and make it the operator's only valid one, adding the
    operator if the cluster does not have it yet. Audited as ACTION in the caller's
    transaction."""
    check_name(name)
    cert = ca.issue(
        public_key, name=name, role=pki.Role.OPERATOR, validity=pki.OPERATOR_VALIDITY, now=now
    )
    created = conn.execute(
        "INSERT INTO operators (name, cert_serial, cert_not_after) VALUES (%s, %s, %s)"
        " ON CONFLICT (name) DO UPDATE SET cert_serial = excluded.cert_serial,"
        " cert_not_after = excluded.cert_not_after"
        " RETURNING (xmax = 0)",
        (name, cert.serial_number, cert.not_valid_after_utc),
    ).fetchone()
    audit.record(
        conn,
        actor,
        action,
        f"operator:{name}",
        {
            "serial": format(cert.serial_number, "x"),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "created": bool(created and created[0]),
        },
    )
    return cert


def is_current(conn: psycopg.Connection[Any], identity: pki.Identity) -> bool:
    """Whether IDENTITY is an operator the cluster knows, holding its current certificate."""
    row = conn.execute(
        "SELECT 1 FROM operators WHERE name = %s AND cert_serial = %s AND cert_not_after > now()",
        (identity.name, identity.serial),
    ).fetchone()
    return row is not None


def person_of(conn: psycopg.Connection[Any], identity: pki.Identity) -> access.Person | None:
    """The operator IDENTITY is, with its role and tenants, if it holds its current
    certificate (by the rule of `is_current`); None otherwise. Notes when it was last used
    (at most once a minute, so a burst of requests writes once)."""
    row = conn.execute(
        "UPDATE operators SET last_used_at = now()"
        " WHERE name = %s AND cert_serial = %s AND cert_not_after > now()"
        " AND (last_used_at IS NULL OR last_used_at < now() - interval '1 minute')"
        " RETURNING role, tenants",
        (identity.name, identity.serial),
    ).fetchone()
    if row is None:
        row = conn.execute(
            "SELECT role, tenants FROM operators"
            " WHERE name = %s AND cert_serial = %s AND cert_not_after > now()",
            (identity.name, identity.serial),
        ).fetchone()
    if row is None:
        return None
    return access.person("operator", identity.name, row[0], row[1])


def current_serials(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """Each operator's current certificate serial (decimal), by the rule of `is_current`:
    what Temporal's host makes admin."""
    rows = conn.execute(
        "SELECT name, cert_serial FROM operators WHERE cert_not_after > now()"
    ).fetchall()
    return {str(name): str(int(serial)) for name, serial in rows}
