"""Every filter of the node and job listings reads its index, in a prepared statement's
generic plan too (psycopg prepares a statement run five times; PostgreSQL may then plan it
once for any parameters). No server runs here: the statements are the listing functions'
own, recorded as they run, then planned as a generic plan with sequential scans off."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, cast

import psycopg
import pytest
from psycopg import sql

from oz0 import nodes
from oz0.jobs import store

Conn = psycopg.Connection[Any]
PLACEHOLDER = re.compile(r"%\((\w+)\)s")


class Recording:
    """A connection that keeps the first statement it is given (the listing's own)."""

    def __init__(self, conn: Conn) -> None:
        self.conn = conn
        self.sent: list[tuple[str, Mapping[str, Any]]] = []

    def execute(self, query: str, params: Mapping[str, Any]) -> psycopg.Cursor[Any]:
        self.sent.append((query, params))
        return self.conn.execute(query, params)


def generic_plan(conn: Conn, query: str, params: Mapping[str, Any]) -> str:
    """QUERY's generic plan (its parameters $1, $2... unknown when it is planned)."""
    names = list(dict.fromkeys(PLACEHOLDER.findall(query)))
    numbered = PLACEHOLDER.sub(lambda m: f"${names.index(m[1]) + 1}", query)
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.execute("SET enable_seqscan = off")
    try:
        conn.execute(f"PREPARE probe AS {numbered}")
        values = sql.SQL(", ").join(sql.Literal(params[name]) for name in names)
        rows = conn.execute(sql.SQL("EXPLAIN EXECUTE probe({})").format(values)).fetchall()
        return "\n".join(str(r[0]) for r in rows)
    finally:
        conn.execute("DEALLOCATE ALL")
        conn.execute("RESET ALL")


def node_count_plan(conn: Conn, matching: nodes.NodeFilter) -> str:
    recording = Recording(conn)
    nodes.count_nodes(cast(Conn, recording), matching, most=10)
    return generic_plan(conn, *recording.sent[0])


def job_list_plan(conn: Conn, filters: dict[str, str]) -> str:
    recording = Recording(conn)
    store.list_jobs(cast(Conn, recording), tenant=filters.get("tenant"), state=filters.get("state"))
    return generic_plan(conn, *recording.sent[0])


@pytest.mark.parametrize(
    ("matching", "index", "condition"),
    [
        (nodes.NodeFilter(state="pending"), "nodes_state_listing", "(state = $1)"),
        (nodes.NodeFilter(tenant="blue"), "nodes_tenant_listing", "(tenant = $1)"),
        (nodes.NodeFilter(label=("role", "web")), "nodes_labels", "(labels @> $1)"),
        (nodes.NodeFilter(label=("role", None)), "nodes_labels", "(labels ? $1)"),
    ],
)
def test_each_node_filter_reads_its_index_in_a_generic_plan(
    conn: Conn, matching: nodes.NodeFilter, index: str, condition: str
) -> None:
    plan = node_count_plan(conn, matching)
    assert index in plan and f"Index Cond: {condition}" in plan, plan


@pytest.mark.parametrize(
    ("filters", "index"),
    [({"tenant": "default"}, "jobs_listing"), ({"state": "queued"}, "jobs_by_state")],
)
def test_each_job_filter_reads_its_index_in_a_generic_plan(
    conn: Conn, filters: dict[str, str], index: str
) -> None:
    (column,) = filters
    plan = job_list_plan(conn, filters)
    assert index in plan and f"Index Cond: ({column} = $1)" in plan, plan


def test_a_filter_not_given_is_not_in_the_statement() -> None:
    assert nodes.NodeFilter().where().sql == ""
    where = nodes.NodeFilter(tenant="blue").where()
    assert (where.sql, dict(where.params)) == (" WHERE tenant = %(tenant)s", {"tenant": "blue"})


def test_an_unknown_state_is_refused_when_the_filter_is_made() -> None:
    with pytest.raises(nodes.NodeError, match="unknown state 'lost'"):
        nodes.NodeFilter.of_args(state="lost")
    with pytest.raises(nodes.NodeError, match="invalid label filter '=x'"):
        nodes.NodeFilter.of_args(label="=x")
