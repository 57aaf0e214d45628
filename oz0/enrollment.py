"""Adding a person: `operator add` makes a one-time enrollment code, `operator enroll` on
the person's own machine trades it (with a certificate request for a key that never leaves
that machine) for the person's certificate and, if it asks, its web UI account.

The code is 32 random bytes; the database keeps only its SHA-256 (a slow hash would add
nothing to so much randomness). It works once, until it expires (DEFAULT_EXPIRES, at most
MAX_EXPIRES). Refused codes are counted per source address over FAILURE_WINDOW, in the
database so that every server counts alike; past MAX_FAILURES_PER_SOURCE the source is
refused without looking at its code, as sign-ins are.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import secrets
import shlex
from dataclasses import dataclass
from typing import Any

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import access, operators, pki, tokens
from oz0.context import server_address
from oz0.errors import Oz0Error

DEFAULT_EXPIRES = "1h"
MAX_EXPIRES = dt.timedelta(hours=48)
FAILURE_WINDOW = dt.timedelta(minutes=15)
MAX_FAILURES_PER_SOURCE = 10
ENV_VAR = "OZ0_ENROLL_CODE"
# A code is 43 characters; a body field much longer is not one (and is not hashed).
MAX_CODE = 100


class CodeRefused(Oz0Error):
    """A wrong, used or expired code (HTTP 403), or too many refusals from one source (429);
    the message is the one line the person reads."""

    def __init__(self, message: str, status: int = 403) -> None:
        super().__init__(message)
        self.status = status


_ASK_AGAIN = "ask an admin for a new one (orchestrator-zero operator add)"
WRONG = CodeRefused(f"enrollment code refused: the cluster gave no such code; {_ASK_AGAIN}")
USED = CodeRefused(f"enrollment code already used (a code works once); {_ASK_AGAIN}")
TOO_MANY = CodeRefused(
    "too many refused enrollment codes from this address; try again in a quarter of an hour",
    429,
)


def expired(at: dt.datetime) -> CodeRefused:
    return CodeRefused(f"enrollment code expired at {at:%Y-%m-%d %H:%M:%SZ}; {_ASK_AGAIN}")


def cancelled(reason: str) -> CodeRefused:
    return CodeRefused(f"enrollment code cancelled: {reason}; {_ASK_AGAIN}")


def parse_expires(text: str) -> dt.timedelta:
    """How long a code works: 30m, 1h, 2d ... up to MAX_EXPIRES."""
    try:
        lifetime = tokens.parse_ttl(text)
    except Oz0Error:
        lifetime = None
    if lifetime is None or lifetime > MAX_EXPIRES:
        raise operators.OperatorError(
            f"invalid --expires {text!r}: use a number with d, h, m or s (such as 1h or 30m), "
            f"at most {int(MAX_EXPIRES.total_seconds()) // 3600}h"
        )
    return lifetime


def code_digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()


def source_of(client: Any) -> str:
    """Where a request came from, as failures are counted: an IPv6 address by its /64 (one
    machine usually holds a whole /64, and would otherwise count as billions of sources)."""
    host = str(client[0]) if client else "unknown"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass(frozen=True)
class Added:
    name: str
    role: access.Role
    tenants: tuple[str, ...]
    expires_at: dt.datetime
    code: str
    enroll_command: str

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": str(self.role),
            "tenants": list(self.tenants),
            "expires_at": self.expires_at.isoformat(),
            "enroll_command": self.enroll_command,
        }


def enroll_command(code: str, server: str, ca_hash: str) -> str:
    """The one command the person runs on its own machine; the code in its environment,
    never in its arguments (every user of a machine can read those)."""
    q = shlex.quote
    return (
        f"{ENV_VAR}={q(code)} orchestrator-zero operator enroll"
        f" --server {q(server_address(server))} --ca-hash {q(ca_hash)}"
    )


def add(
    conn: psycopg.Connection[Any],
    actor: access.Person,
    name: str,
    role: access.Role,
    tenants: list[str],
    lifetime: dt.timedelta,
    *,
    server: str,
    ca_hash: str,
) -> Added:
    """A new enrollment for NAME with ROLE in TENANTS (none: every tenant), made by ACTOR;
    audited `operator.add`. Refused when NAME is an operator or has an open enrollment."""
    operators.check_name(name)
    actor.check(access.Right.MANAGE_OPERATORS, "add operators")
    granted = operators.check_grant(conn, actor, tenants, "add operators")
    if conn.execute("SELECT 1 FROM operators WHERE name = %s", (name,)).fetchone():
        raise _taken(name)
    # An enrollment that expired (or, its operator since removed, was used) gives way.
    conn.execute(
        "DELETE FROM operator_enrollments WHERE name = %s"
        " AND (used_at IS NOT NULL OR expires_at <= now())",
        (name,),
    )
    code = secrets.token_urlsafe(32)
    row = conn.execute(
        "INSERT INTO operator_enrollments"
        " (name, code_sha256, role, tenants, created_by, expires_at)"
        " VALUES (%s, %s, %s, %s, %s, now() + %s) ON CONFLICT (name) DO NOTHING"
        " RETURNING expires_at",
        (name, code_digest(code), str(role), list(granted), f"{actor.kind}:{actor.name}", lifetime),
    ).fetchone()
    if row is None:
        pending = conn.execute(
            "SELECT tenants FROM operator_enrollments WHERE name = %s", (name,)
        ).fetchone()
        if pending is not None and not actor.reaches_all(pending[0]):
            # Names are the cluster's: that one is taken is all another tenant's admin learns.
            raise _taken(name)
        raise operators.OperatorConflict(
            f"operator {name} has an open enrollment already: `operator remove {name}` "
            "voids its code, then add it again"
        )
    expires_at: dt.datetime = row[0]
    operators.record(
        conn, actor, "operator.add", name, granted,
        {"role": str(role), "tenants": list(granted), "expires_at": expires_at.isoformat()},
    )  # fmt: skip
    return Added(
        name, role, granted, expires_at, code, enroll_command(code, server, ca_hash)
    )  # fmt: skip


def _taken(name: str) -> operators.OperatorConflict:
    return operators.OperatorConflict(
        f"operator {name} exists already: change it with `operator set {name}`, or "
        f"`operator remove {name}` first to add it anew"
    )


def _failed(conn: psycopg.Connection[Any], source: str) -> None:
    conn.execute("DELETE FROM operator_enroll_failures WHERE at < now() - %s", (FAILURE_WINDOW,))
    conn.execute("INSERT INTO operator_enroll_failures (source) VALUES (%s)", (source,))


def _refusal(conn: psycopg.Connection[Any], digest: str) -> CodeRefused | None:
    """Why the code of DIGEST does not work now (None: it does)."""
    row = conn.execute(
        "SELECT used_at IS NOT NULL, expires_at, expires_at <= now(), cancelled"
        " FROM operator_enrollments WHERE code_sha256 = %s",
        (digest,),
    ).fetchone()
    if row is None:
        return WRONG
    if row[0]:
        return USED
    if row[3] is not None:  # it was made to expire as it was cancelled: first
        return cancelled(row[3])
    if row[2]:
        return expired(row[1])
    return None


def check_code(conn: psycopg.Connection[Any], code: str, source: str) -> CodeRefused | None:
    """Whether CODE works, read before the slow part (hashing a web password); a refusal
    is counted against SOURCE in this transaction (so it is returned, not raised)."""
    too_many = conn.execute(
        "SELECT count(*) >= %s FROM operator_enroll_failures WHERE source = %s AND at > now() - %s",
        (MAX_FAILURES_PER_SOURCE, source, FAILURE_WINDOW),
    ).fetchone()
    if too_many and too_many[0]:
        return TOO_MANY
    refusal = WRONG if len(code) > MAX_CODE else _refusal(conn, code_digest(code))
    if refusal is not None:
        _failed(conn, source)
    return refusal


@dataclass(frozen=True)
class Enrolled:
    person: access.Person
    certificate: x509.Certificate
    web_sign_in: bool

    def to_json(self, cluster: str) -> dict[str, Any]:
        return {
            **self.person.to_json(),
            "cluster": cluster,
            "certificate": pki.cert_to_pem(self.certificate).decode(),
            "not_after": self.certificate.not_valid_after_utc.isoformat(),
            "web_sign_in": self.web_sign_in,
        }


def enroll(
    conn: psycopg.Connection[Any],
    ca: pki.CertificateAuthority,
    code: str,
    public_key: ec.EllipticCurvePublicKey,
    password_hash: str | None,
    source: str,
) -> Enrolled | CodeRefused:
    """Use CODE: the operator it was made for, with a 90-day certificate for PUBLIC_KEY and,
    with PASSWORD_HASH, its web UI account. A code used or expired since `check_code` is
    a refusal (counted). Audited `operator.enroll`, in the new person's name."""
    digest = code_digest(code)
    row = conn.execute(
        "UPDATE operator_enrollments SET used_at = now()"
        " WHERE code_sha256 = %s AND used_at IS NULL AND expires_at > now()"
        " RETURNING name, role, tenants, created_by",
        (digest,),
    ).fetchone()
    if row is None:
        refusal = _refusal(conn, digest) or WRONG
        _failed(conn, source)
        return refusal
    name, role, tenants, created_by = row
    cert = ca.issue(public_key, name=name, role=pki.Role.OPERATOR, validity=pki.OPERATOR_VALIDITY)
    created = conn.execute(
        "INSERT INTO operators (name, cert_serial, cert_not_after, role, tenants)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING name",
        (name, cert.serial_number, cert.not_valid_after_utc, role, tenants),
    ).fetchone()
    if created is None:
        # `server operator issue` made it meanwhile; the code stays unused (rolled back).
        raise operators.OperatorConflict(
            f"operator {name} exists already (made since the code was given): "
            "ask an admin to remove it and add you again"
        )
    # A web account of the name left from before is not this person's: it goes, and its
    # sessions with it.
    conn.execute("DELETE FROM ui_accounts WHERE username = %s", (name,))
    if password_hash is not None:
        conn.execute(
            "INSERT INTO ui_accounts (username, password_hash) VALUES (%s, %s)",
            (name, password_hash),
        )
    person = access.person("operator", name, role, tenants)
    operators.record(
        conn, person, "operator.enroll", name, tenants,
        {
            "added_by": created_by, "serial": format(cert.serial_number, "x"),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "web_sign_in": password_hash is not None, "source": source,
        },
    )  # fmt: skip
    return Enrolled(person, cert, password_hash is not None)


@dataclass(frozen=True)
class Open:
    """An enrollment not used yet whose code still works: for whom, with what."""

    name: str
    role: access.Role
    tenants: tuple[str, ...]


def open_made_by(conn: psycopg.Connection[Any], makers: list[str]) -> list[Open]:
    """The enrollments MAKERS made (`operator:alice`, `ui:alice`) whose code still works,
    locked until the transaction ends."""
    rows = conn.execute(
        "SELECT name, role, tenants FROM operator_enrollments"
        " WHERE created_by = ANY(%s) AND used_at IS NULL AND expires_at > now()"
        " ORDER BY name FOR UPDATE",
        (makers,),
    ).fetchall()
    return [Open(str(n), access.Role(r), tuple(sorted(t))) for n, r, t in rows]


def cancel(
    conn: psycopg.Connection[Any],
    enrollments: list[Open],
    actor: access.Person,
    reason: str,
    because: dict[str, Any],
) -> None:
    """Make ENROLLMENTS' codes void, for REASON (what their person is told); each audited
    `operator.enrollment.cancel` with BECAUSE. The code expires now too: a server of the
    previous release, which knows no cancellation, refuses it as expired."""
    if not enrollments:
        return
    conn.execute(
        "UPDATE operator_enrollments SET cancelled = %s, expires_at = least(expires_at, now())"
        " WHERE name = ANY(%s)",
        (reason, [e.name for e in enrollments]),
    )
    for e in enrollments:
        operators.record(
            conn, actor, "operator.enrollment.cancel", e.name, e.tenants,
            {"role": str(e.role), "tenants": list(e.tenants), "reason": reason, **because},
        )  # fmt: skip
