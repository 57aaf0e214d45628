"""A fleet and an audit log of benchmark size, written by PostgreSQL itself
(generate_series), for bench.listings and for reading query plans by hand:

    python -m bench.listings_data URL [--nodes N] [--audit-rows M]

fills the (migrated) oz0 database at URL. Tenants t0..t9 (t0 is `default`'s sibling);
states mostly accepted, 2 % pending, 4 % blocked, 2 % rejected, 2 % purging; labels
role (5 values), zone (10), rack (100); host names host-NNNNN.example; joined one second
apart, oldest first. Audit rows spread over 10 actions, 20 actors and every node.
"""

from __future__ import annotations

import argparse
from typing import Any

import psycopg

TENANTS = [f"t{i}" for i in range(10)]
ROLES = ["web", "db", "cache", "batch", "edge"]
ACTIONS = [
    "node.join", "node.accept", "node.block", "node.unblock", "node.renew",
    "node.reject", "node.delete", "token.create", "job.run", "operator.renew",
]  # fmt: skip

# i is the node's number from 0: the state it gets, by remainder of 50.
_STATE = (
    "CASE WHEN i %% 50 = 7 THEN 'pending' WHEN i %% 50 IN (11, 31) THEN 'blocked'"
    " WHEN i %% 50 = 13 THEN 'rejected' WHEN i %% 50 = 17 THEN 'purging' ELSE 'accepted' END"
)


def node_id(i: int) -> str:
    """The ID fill_nodes gives node number I."""
    return f"node-{i:012x}"


def fill_nodes(conn: psycopg.Connection[Any], count: int, server: str | None = None) -> None:
    """COUNT nodes; the accepted ones connected through SERVER (a servers row) if given,
    for an hour."""
    conn.execute(
        "INSERT INTO tenants (name) SELECT unnest(%s::text[]) ON CONFLICT DO NOTHING",
        (TENANTS,),
    )
    conn.execute(
        "INSERT INTO nodes (id, tenant, state, labels, hostname, public_key_sha256, server,"
        " last_seen, joined_at)"
        " SELECT 'node-' || lpad(to_hex(i), 12, '0'),"
        "  't' || (i %% 10),"
        f"  {_STATE},"
        "  jsonb_build_object('role', (%(roles)s::text[])[1 + i %% 5],"
        "    'zone', 'z' || (i / 7 %% 10), 'rack', 'r' || (i / 3 %% 100)),"
        "  'host-' || lpad(i::text, 5, '0') || '.example',"
        "  md5(i::text),"
        f"  CASE WHEN {_STATE} = 'accepted' THEN %(server)s::text END,"
        # An hour ahead: shown connected for the whole run (while their server is up), as
        # agents' heartbeats would keep them, without a writer that disturbs the pages.
        f"  CASE WHEN {_STATE} = 'accepted' THEN now() + interval '1 hour' END,"
        "  now() - (%(count)s - i) * interval '1 second'"
        " FROM generate_series(0, %(count)s - 1) AS i",
        {"roles": ROLES, "server": server, "count": count},
    )


def fill_audit(conn: psycopg.Connection[Any], count: int, nodes: int) -> None:
    """COUNT audit rows, oldest first, about the first NODES nodes."""
    conn.execute(
        "INSERT INTO audit_log (at, actor_kind, actor, action, target, details)"
        " SELECT now() - (%(count)s - i) * interval '10 ms',"
        "  (ARRAY['operator', 'node', 'server', 'ui'])[1 + i %% 4],"
        "  'actor-' || (i %% 20),"
        "  (%(actions)s::text[])[1 + i / 3 %% 10],"
        "  'node:node-' || lpad(to_hex(i %% %(nodes)s), 12, '0'),"
        "  jsonb_build_object('n', i)"
        " FROM generate_series(0, %(count)s - 1) AS i",
        {"count": count, "actions": ACTIONS, "nodes": max(1, nodes)},
    )


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.listings_data", description=__doc__)
    parser.add_argument("url")
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--audit-rows", type=int, default=1_000_000)
    args = parser.parse_args()
    with psycopg.connect(args.url) as conn:
        fill_nodes(conn, args.nodes)
        fill_audit(conn, args.audit_rows, args.nodes)
        conn.execute("ANALYZE nodes")
        conn.execute("ANALYZE audit_log")


if __name__ == "__main__":
    main()
