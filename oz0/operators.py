"""Operators: who may use the management API, each with exactly one valid certificate."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from oz0 import access, audit, pki
from oz0.errors import Oz0Error
from oz0.json_values import iso

_NAME = re.compile(r"[a-z0-9][a-z0-9._-]{0,62}")


class OperatorError(Oz0Error):
    """A change of operators refused; STATUS is the HTTP status the API answers with."""

    status = 400


class OperatorNotFound(OperatorError):
    status = 404


class OperatorConflict(OperatorError):
    """The name is taken, or the change would leave the cluster without a cluster-wide
    admin."""

    status = 409


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
    create: bool = True,
) -> x509.Certificate:
    """Sign a 90-day certificate and make it the operator's only valid one, adding the
    operator (a cluster-wide admin: `server operator issue` is the recovery path) if the
    cluster does not have it yet and CREATE allows; an existing operator keeps its role and
    tenants. Audited as ACTION in the caller's transaction, with the operator's tenants."""
    check_name(name)
    cert = ca.issue(
        public_key, name=name, role=pki.Role.OPERATOR, validity=pki.OPERATOR_VALIDITY, now=now
    )
    if create:
        row = conn.execute(
            "INSERT INTO operators (name, cert_serial, cert_not_after) VALUES (%s, %s, %s)"
            " ON CONFLICT (name) DO UPDATE SET cert_serial = excluded.cert_serial,"
            " cert_not_after = excluded.cert_not_after"
            " RETURNING (xmax = 0), tenants",
            (name, cert.serial_number, cert.not_valid_after_utc),
        ).fetchone()
    else:
        # A renewal: an operator removed since its request was authorized must not come
        # back (as a new, cluster-wide admin).
        row = conn.execute(
            "UPDATE operators SET cert_serial = %s, cert_not_after = %s WHERE name = %s"
            " RETURNING false, tenants",
            (cert.serial_number, cert.not_valid_after_utc, name),
        ).fetchone()
        if row is None:
            raise OperatorNotFound(f"operator {name} not found (removed?)")
    assert row is not None
    record(
        conn,
        actor,
        action,
        name,
        row[1],
        {
            "serial": format(cert.serial_number, "x"),
            "not_after": cert.not_valid_after_utc.isoformat(),
            "created": bool(row[0]),
        },
    )
    return cert


def record(
    conn: psycopg.Connection[Any],
    actor: audit.Actor,
    action: str,
    name: str,
    tenants: Iterable[str],
    details: dict[str, Any],
) -> None:
    """An audit row about operator NAME, its `tenants` the operator's (a tenant's admin
    sees the changes of its own people; none: a cluster-wide person's, seen cluster-wide)."""
    audit.record(conn, actor, action, f"operator:{name}", details, tenants=tenants)


def is_current(conn: psycopg.Connection[Any], identity: pki.Identity) -> bool:
    """Whether IDENTITY is an operator the cluster knows, holding its current certificate."""
    row = conn.execute(
        "SELECT 1 FROM operators WHERE name = %s AND cert_serial = %s AND cert_not_after > now()",
        (identity.name, identity.serial),
    ).fetchone()
    return row is not None


def is_known(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether the cluster has an operator NAME (whatever its certificate)."""
    return conn.execute("SELECT 1 FROM operators WHERE name = %s", (name,)).fetchone() is not None


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


# --- the people: list, show, set, remove ------------------------------------------------


class OperatorJson(TypedDict):
    """A person as `operator list` shows one."""

    name: str
    role: str
    tenants: list[str]
    state: str
    created_at: str
    certificate_not_after: str | None
    last_used_at: str | None
    web_sign_in: bool
    enroll_expires_at: str | None


@dataclass(frozen=True)
class OperatorInfo:
    """An operator as `operator list` and `operator show` give it; PENDING: added but not
    enrolled yet (no certificate; ENROLL_EXPIRES_AT is when its code stops working)."""

    name: str
    role: access.Role
    tenants: tuple[str, ...]
    pending: bool
    created_at: dt.datetime
    cert_not_after: dt.datetime | None
    last_used_at: dt.datetime | None
    web_sign_in: bool
    enroll_expires_at: dt.datetime | None

    def to_json(self) -> OperatorJson:
        return {
            "name": self.name,
            "role": str(self.role),
            "tenants": list(self.tenants),
            "state": "pending" if self.pending else "enrolled",
            "created_at": self.created_at.isoformat(),
            "certificate_not_after": iso(self.cert_not_after),
            "last_used_at": iso(self.last_used_at),
            "web_sign_in": self.web_sign_in,
            "enroll_expires_at": iso(self.enroll_expires_at),
        }


# Operators, then the open enrollments of names that are no operator yet.
_PEOPLE = (
    "SELECT o.name, o.role, o.tenants, false, o.created_at, o.cert_not_after, o.last_used_at,"
    " EXISTS (SELECT 1 FROM ui_accounts a WHERE a.username = o.name), NULL::timestamptz"
    " FROM operators o WHERE %(name)s::text IS NULL OR o.name = %(name)s"
    " UNION ALL"
    " SELECT e.name, e.role, e.tenants, true, e.created_at, NULL, NULL, false, e.expires_at"
    " FROM operator_enrollments e"
    " WHERE e.used_at IS NULL AND e.expires_at > now()"
    " AND NOT EXISTS (SELECT 1 FROM operators o WHERE o.name = e.name)"
    " AND (%(name)s::text IS NULL OR e.name = %(name)s)"
    " ORDER BY 1"
)


def _info(row: tuple[Any, ...]) -> OperatorInfo:
    return OperatorInfo(row[0], access.Role(row[1]), tuple(sorted(row[2])), *row[3:])


def list_operators(conn: psycopg.Connection[Any], viewer: access.Person) -> list[OperatorInfo]:
    """Every operator and pending enrollment VIEWER may manage: a tenant's admin sees only
    the people all of whose tenants are its own."""
    rows = conn.execute(_PEOPLE, {"name": None}).fetchall()
    return [info for info in map(_info, rows) if viewer.reaches_all(info.tenants)]


def show(conn: psycopg.Connection[Any], viewer: access.Person, name: str) -> OperatorInfo:
    """Operator NAME (or its pending enrollment); not found unless VIEWER may manage it."""
    row = conn.execute(_PEOPLE, {"name": name}).fetchone()
    if row is None or not viewer.reaches_all(row[2]):
        raise OperatorNotFound(f"operator {name} not found")
    return _info(row)


def check_grant(
    conn: psycopg.Connection[Any], actor: access.Person, tenants: Iterable[str], doing: str
) -> tuple[str, ...]:
    """TENANTS (none: every tenant) if they all exist and ACTOR may give them: a tenant's
    admin gives only its own tenants, never the whole cluster. Whether ACTOR may give a
    tenant is asked first: a tenant's admin is answered the same for another tenant as for
    one that does not exist, and so does not learn the others' names."""
    wanted = tuple(sorted(set(tenants)))
    if not actor.cluster_wide:
        if not wanted:
            raise access.Forbidden(f"{actor.describe()} may not {doing} of every tenant")
        for tenant in wanted:
            actor.check(access.Right.MANAGE_OPERATORS, doing, tenant)
    for tenant in wanted:
        if conn.execute("SELECT 1 FROM tenants WHERE name = %s", (tenant,)).fetchone() is None:
            raise OperatorError(f"tenant {tenant} does not exist")
    return wanted


def _lock_cluster_admins(conn: psycopg.Connection[Any]) -> list[str]:
    """The cluster-wide admins, locked (in name order, so two changes never deadlock) until
    the transaction ends: two admins demoting each other at once cannot both succeed."""
    rows = conn.execute(
        "SELECT name FROM operators WHERE role = 'admin' AND tenants = '{}'"
        " ORDER BY name FOR UPDATE"
    ).fetchall()
    return [str(r[0]) for r in rows]


def _refuse_last_admin(admins: list[str], name: str, doing: str) -> None:
    if admins == [name]:
        raise OperatorConflict(
            f"operator {name} is the last cluster-wide admin and may not be {doing}: make "
            "another one first (operator set NAME --role admin --all-tenants)"
        )


# What a removal or a change of a person ends of what it made (oz0/leaving.py), given the
# person as it is now (None: removed), after its row changed in the same transaction: what
# the audit row of the change adds.
Ends = Callable[[psycopg.Connection[Any], access.Person | None], dict[str, Any]]


def set_operator(
    conn: psycopg.Connection[Any],
    actor: access.Person,
    name: str,
    *,
    role: access.Role | None,
    tenants: Sequence[str] | None,
    ends: Ends | None = None,
) -> OperatorInfo:
    """Give operator NAME the role ROLE and the tenants TENANTS (None: unchanged; empty:
    every tenant); then ENDS what it may no longer keep. Every server acts on it within two
    seconds (the `oz0_operators` notification); audited `operator.set`."""
    admins = _lock_cluster_admins(conn)
    row = conn.execute(
        "SELECT role, tenants FROM operators WHERE name = %s FOR UPDATE", (name,)
    ).fetchone()
    if row is None or not actor.reaches_all(row[1]):
        pending = conn.execute(
            "SELECT tenants FROM operator_enrollments WHERE name = %s"
            " AND used_at IS NULL AND expires_at > now()",
            (name,),
        ).fetchone()
        if pending is not None and actor.reaches_all(pending[0]):
            raise OperatorConflict(
                f"operator {name} has not enrolled yet: remove it (operator remove {name}) "
                "and add it again with the role and tenants it should have"
            )
        raise OperatorNotFound(f"operator {name} not found")
    old_role, old_tenants = access.Role(row[0]), tuple(sorted(row[1]))
    new_role = old_role if role is None else role
    new_tenants = (
        old_tenants if tenants is None else check_grant(conn, actor, tenants, "make operators")
    )
    if (new_role, new_tenants) != (old_role, old_tenants):
        if new_role is not access.Role.ADMIN or new_tenants:
            _refuse_last_admin(admins, name, "demoted or scoped")
        conn.execute(
            "UPDATE operators SET role = %s, tenants = %s WHERE name = %s",
            (str(new_role), list(new_tenants), name),
        )
        now = access.person("operator", name, str(new_role), new_tenants)
        ended = ends(conn, now) if ends is not None else {}
        about = () if not old_tenants or not new_tenants else set(old_tenants) | set(new_tenants)
        record(
            conn, actor, "operator.set", name, about,
            {
                "role": {"from": str(old_role), "to": str(new_role)},
                "tenants": {"from": list(old_tenants), "to": list(new_tenants)},
                **ended,
            },
        )  # fmt: skip
    return show(conn, actor, name)


def remove(
    conn: psycopg.Connection[Any], actor: access.Person, name: str, *, ends: Ends | None = None
) -> dict[str, Any]:
    """Remove operator NAME: its certificate, its web UI account (its sessions end with it)
    and any enrollment, then ENDS what it made; every server refuses it within two seconds.
    Audited `operator.remove`; what was removed."""
    admins = _lock_cluster_admins(conn)
    info = show(conn, actor, name)
    if not info.pending:
        _refuse_last_admin(admins, name, "removed")
    conn.execute("DELETE FROM operators WHERE name = %s", (name,))
    sessions_ended = conn.execute(
        "SELECT count(*) FROM ui_sessions WHERE username = %s", (name,)
    ).fetchone()
    web = conn.execute("DELETE FROM ui_accounts WHERE username = %s", (name,)).rowcount
    conn.execute("DELETE FROM operator_enrollments WHERE name = %s", (name,))
    ended = ends(conn, None) if ends is not None else {}
    removed = {
        "name": name,
        "role": str(info.role),
        "tenants": list(info.tenants),
        "was": "pending" if info.pending else "enrolled",
        "web_account": bool(web),
        "sessions_ended": int(sessions_ended[0]) if web and sessions_ended else 0,
    }
    record(conn, actor, "operator.remove", name, info.tenants, {**removed, **ended})
    return removed


def temporal_grants(conn: psycopg.Connection[Any]) -> dict[str, dict[str, Any]]:
    """What Temporal's host lets each operator do: its current certificate serial (decimal,
    by the rule of `is_current`), its role and its tenants (none: every tenant). With
    them it lets the operator read in its tenants' namespaces and nothing more."""
    rows = conn.execute(
        "SELECT name, cert_serial, role, tenants FROM operators WHERE cert_not_after > now()"
    ).fetchall()
    return {
        str(name): {"serial": str(int(serial)), "role": str(role), "tenants": sorted(tenants)}
        for name, serial, role, tenants in rows
    }
