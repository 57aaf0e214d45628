"""Tenants: each has a Temporal namespace of the same name."""

from __future__ import annotations

import datetime as dt
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from oz0 import audit, listing
from oz0.errors import Oz0Error
from oz0.store.pool import Database

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class TenantRefused(Oz0Error):
    """A tenant that cannot be created; STATUS is the HTTP status the API answers with."""

    status = 400


class InvalidTenantName(TenantRefused):
    pass


class TenantExists(TenantRefused):
    status = 409


class NamespaceUnavailable(TenantRefused):
    status = 503


class Namespaces(Protocol):
    async def register_tenant_namespace(self, name: str) -> None:
        """Registers the namespace NAME, or finds it registered by us before; TenantExists
        if Temporal has one of that name that is not ours."""


@dataclass(frozen=True)
class Tenant:
    name: str
    created_at: dt.datetime

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "namespace": self.name,
            "created_at": self.created_at.isoformat(),
        }


# Temporal's own namespaces (temporal-system, and whatever it adds) take this prefix.
RESERVED_PREFIX = "temporal-"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidTenantName(
            f"invalid tenant name {name!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    if name.startswith(RESERVED_PREFIX):
        raise InvalidTenantName(
            f"tenant name {name!r} is reserved: names starting with {RESERVED_PREFIX!r} "
            "are Temporal's own namespaces"
        )
    return name


def exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT 1 FROM tenants WHERE name = %s", (name,)).fetchone() is not None


def create(conn: psycopg.Connection[Any], name: str, actor: audit.Actor) -> Tenant:
    row = conn.execute(
        "INSERT INTO tenants (name) VALUES (%s) ON CONFLICT DO NOTHING RETURNING name, created_at",
        (check_name(name),),
    ).fetchone()
    if row is None:
        raise TenantExists(f"tenant {name} already exists")
    audit.record(
        conn, actor, "tenant.create", f"tenant:{name}", {"namespace": name}, tenants=[name]
    )
    return Tenant(*row)


async def create_with_namespace(
    db: Database, temporal: Namespaces, name: str, actor: audit.Actor
) -> Tenant:
    """A new tenant and its Temporal namespace, as the API and the web UI make it;
    TenantRefused (with its HTTP status) if not, and then nothing is created."""
    check_name(name)
    if await db.transaction(lambda conn: exists(conn, name)):
        raise TenantExists(f"tenant {name} already exists")
    # The namespace first: registering is idempotent, so a failure after it leaves
    # nothing a retry would trip over, while a tenant row without a namespace would.
    try:
        await temporal.register_tenant_namespace(name)
    except TenantExists:
        raise
    except Exception as e:
        log.warning("registering namespace %s failed: %r", name, e)
        raise NamespaceUnavailable(f"could not register Temporal namespace {name}: {e}") from None
    return await db.transaction(lambda conn: create(conn, name, actor))


def list_tenants(conn: psycopg.Connection[Any], *, scope: listing.Scope = None) -> list[Tenant]:
    """The tenants of SCOPE (None: every tenant), by name."""
    where = listing.Where().within("name", scope)
    rows = conn.execute(
        "SELECT name, created_at FROM tenants" + where.sql + " ORDER BY name", where.params
    )
    return [Tenant(*r) for r in rows]


def node_counts(
    conn: psycopg.Connection[Any], *, scope: listing.Scope = None
) -> dict[str, dict[str, int]]:
    """Per tenant of SCOPE (None: all), how many of its nodes are in each state (states
    without nodes absent)."""
    where = listing.Where().within("tenant", scope)
    counts: dict[str, dict[str, int]] = {}
    for tenant, state, count in conn.execute(
        "SELECT tenant, state, count(*) FROM nodes" + where.sql + " GROUP BY tenant, state",
        where.params,
    ):
        counts.setdefault(tenant, {})[state] = int(count)
    return counts
