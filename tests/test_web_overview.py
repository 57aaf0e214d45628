"""The overview's counts, from a real database: every tenant, its nodes by state, and how
many are connected (through a server that is up, heard from lately)."""

from __future__ import annotations

import secrets
from typing import Any

import psycopg

from oz0 import nodes
from oz0.web.overview import fleet_counts

UP, DOWN = "server-up", "server-down"


def add(conn: psycopg.Connection[Any], tenant: str, state: str, server: str | None) -> None:
    conn.execute(
        "INSERT INTO nodes (id, tenant, state, labels, public_key_sha256, server, last_seen)"
        " VALUES (%s, %s, %s, '{}', %s, %s, now())",
        (nodes.new_node_id(), tenant, state, secrets.token_hex(32), server),
    )


def test_nodes_by_tenant_and_state_and_connected(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "INSERT INTO servers (id, advertise, version) VALUES (%s, '127.0.0.1', 't'),"
        " (%s, '127.0.0.2', 't')",
        (UP, DOWN),
    )
    conn.execute("UPDATE servers SET last_heartbeat = now() - interval '1 hour' WHERE id = %s",
                 (DOWN,))  # fmt: skip
    conn.execute("INSERT INTO tenants (name) VALUES ('acme'), ('empty')")
    for tenant, state, server in [
        ("default", "accepted", UP), ("default", "accepted", DOWN), ("default", "pending", None),
        ("acme", "blocked", None), ("acme", "accepted", UP), ("acme", "accepted", UP),
    ]:  # fmt: skip
        add(conn, tenant, state, server)
    counts = {t.name: (dict(t.by_state), t.connected, t.total) for t in fleet_counts(conn)}
    assert counts == {
        "acme": ({"accepted": 2, "blocked": 1}, 2, 3),
        "default": ({"accepted": 2, "pending": 1}, 1, 3),  # the down server's node is not
        "empty": ({}, 0, 0),
    }
