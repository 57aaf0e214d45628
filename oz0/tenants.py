"""Tenants: each has a Temporal namespace of the same name."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

import psycopg

from oz0 import audit
from oz0.errors import Oz0Error

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class TenantExists(Oz0Error):
    pass


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
    if not _NAME.match(name):
        raise Oz0Error(
            f"invalid tenant name {name!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    if name.startswith(RESERVED_PREFIX):
        raise Oz0Error(
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
    audit.record(conn, actor, "tenant.create", f"tenant:{name}", {"namespace": name})
    return Tenant(*row)


def list_tenants(conn: psycopg.Connection[Any]) -> list[Tenant]:
    return [Tenant(*r) for r in conn.execute("SELECT name, created_at FROM tenants ORDER BY name")]
