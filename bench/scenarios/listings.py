"""Listings at 50,000 nodes and 1,000,000 audit rows (issue 13, goal 4).

    python -m bench.listings [--nodes N] [--audit-rows M] [--samples S] [--web-rounds W]

The runner (bench/runner.py) starts a fresh test cluster and one real server on
127.0.0.219 (default ports); then N nodes and M audit rows written by PostgreSQL
(bench.listings_data; the accepted nodes shown connected through that server), VACUUM
ANALYZE. Each listing is then walked page by page through the server's API with the
cluster context's operator certificate (cli.client.ApiClient, what `node list` and
`audit list` run: one TLS connection a request), again from the start until S pages are
timed; every page's time, from request to decoded answer, is one sample (pages of 500
nodes and of 500 audit rows, what the CLI asks for); then the same over one
kept-alive connection, without a TLS handshake a page. With each walk: the server
process's CPU time a page (/proc; PostgreSQL's own is not in it), which the load of other
processes on the machine changes less than it changes the latencies. Also: the web UI's fleet
page's two queries (the capped count and the OFFSET page) timed in-process at pages 1,
100 and 1000, W times each.

Each figure is p50 / p90 / p99 / max in ms, and the count of samples.
"""

from __future__ import annotations

import argparse
import functools
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import psycopg

from bench import listings_data
from bench.measure import cpu_seconds, percentiles
from bench.runner import Bench, Scenario, log
from cli import client as api_client
from cli.client import ApiClient
from oz0 import nodes
from oz0.context import Context
from oz0.web import node_pages, paging

ADDRESS = "127.0.0.219"
# The walks: what the CLI command would list, and the API's query for it.
NODE_WALKS: list[tuple[str, dict[str, str]]] = [
    ("node list (all)", {}),
    ("node list --state pending", {"state": "pending"}),
    ("node list --tenant t3", {"tenant": "t3"}),
    ("node list --label role=web", {"label": "role=web"}),
    ("node list --label rack=r7", {"label": "rack=r7"}),
    ("node list --search host-4", {"search": "host-4"}),
    ("node list --search (no match)", {"search": "no-such-host"}),
]
AUDIT_WALKS: list[tuple[str, dict[str, str]]] = [
    ("audit list (all)", {}),
    ("audit list --action node.block", {"action": "node.block"}),
    ("audit list --actor actor-3", {"actor": "actor-3"}),
    ("audit list --target node:...", {"target": "node:" + listings_data.node_id(255)}),
]


class KeptAlive:
    """GETs over one kept-alive TLS connection with the operator's certificate: the page
    without the handshake that ApiClient (a connection a request) pays each time."""

    def __init__(self, context: Context) -> None:
        tls = ssl.create_default_context(cafile=str(context.ca_path))
        tls.check_hostname = False
        tls.load_cert_chain(str(context.cert_path), str(context.key_path))
        self._https = api_client.connection(ADDRESS, 8443, tls, timeout=30)

    def get(self, path: str, query: dict[str, Any]) -> Any:
        given = {k: v for k, v in query.items() if v is not None}
        self._https.request("GET", f"{path}?{urllib.parse.urlencode(given)}")
        answer = self._https.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"HTTP {answer.status}: {body[:200]!r}")
        return json.loads(body)


def walk(
    api: ApiClient | KeptAlive, path: str, query: dict[str, str], key: str, limit: int, most: int
) -> tuple[list[float], int]:
    """Page through PATH (MOST pages at most): each page's seconds, and the rows seen."""
    times: list[float] = []
    rows = 0
    cursor: str | None = None
    for _ in range(most):
        started = time.perf_counter()
        answer = api.get(path, {**query, "limit": limit, "cursor": cursor})
        times.append(time.perf_counter() - started)
        rows += len(answer[key])
        cursor = answer["next_cursor"]
        if cursor is None:
            break
    return times, rows


def timed(work: Callable[[], object], times: int) -> list[float]:
    out = []
    for _ in range(times):
        started = time.perf_counter()
        work()
        out.append(time.perf_counter() - started)
    return out


def web_queries(url: str, rounds: int) -> dict[str, Any]:
    """The fleet page's queries at pages 1, 100 and 1000, no filter and by state."""
    figures: dict[str, Any] = {}
    with psycopg.connect(url) as conn:
        cases: list[tuple[str, nodes.NodeFilter]] = [
            ("all", nodes.NodeFilter()), ("state=accepted", nodes.NodeFilter(state="accepted")),
        ]  # fmt: skip
        for name, wanted in cases:
            count = functools.partial(
                nodes.count_nodes, conn, wanted, most=node_pages.COUNT_UP_TO + 1
            )
            samples = timed(count, rounds)
            figures[f"count {name}"] = {**percentiles(samples), "count": len(samples)}
            for number in (1, 100, 1000):
                page = functools.partial(
                    nodes.list_nodes, conn, wanted, limit=paging.ROWS + 1,
                    offset=(number - 1) * paging.ROWS,
                )  # fmt: skip
                samples = timed(page, rounds)
                figures[f"page {number} {name}"] = {**percentiles(samples), "count": len(samples)}
    return figures


def measure(bench: Bench) -> None:
    args, files, server, out = bench.args, bench.files, bench.server, bench.out
    url = bench.url
    api = ApiClient(Context.load(files.context_path))
    # Through the API: a tenant needs its Temporal namespace, or the server's job
    # worker for it fails and restarts.
    for tenant in listings_data.TENANTS:
        api.post("/api/v1/tenants", {"name": tenant})
    with psycopg.connect(url.conninfo, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM servers").fetchone()
        assert row is not None
        started = time.monotonic()
        listings_data.fill_nodes(conn, args.nodes, server=str(row[0]))
        listings_data.fill_audit(conn, args.audit_rows, args.nodes)
        conn.execute("VACUUM ANALYZE nodes")
        conn.execute("VACUUM ANALYZE audit_log")
        log(f"filled in {time.monotonic() - started:.0f} s")
    walks = [
        ("one node a page (the cost of a request)", "/api/v1/nodes", {}, "nodes", 1),
        *[(n, "/api/v1/nodes", q, "nodes", 500) for n, q in NODE_WALKS],
        *[(n, "/api/v1/audit", q, "entries", 500) for n, q in AUDIT_WALKS],
    ]
    kept = KeptAlive(Context.load(files.context_path))
    for label, client in (("api_page_ms", api), ("kept_alive_page_ms", kept)):
        figures: dict[str, Any] = {}
        for name, path, query, key, limit in walks:
            samples: list[float] = []
            rows = 0
            cpu_before = cpu_seconds(server.pid)
            while len(samples) < args.samples:
                left = args.samples - len(samples)
                times, rows = walk(client, path, query, key, limit, left)
                samples += times
            cpu = cpu_seconds(server.pid) - cpu_before
            figures[name] = {
                **percentiles(samples), "count": len(samples), "page": limit,
                "rows_per_walk": rows,
                "server_cpu_ms_per_page": round(1000 * cpu / len(samples), 1),
            }  # fmt: skip
            log(f"{label} {name}: {figures[name]}")
        out[label] = figures
    out["web_queries_ms"] = web_queries(url.conninfo, args.web_rounds)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=50_000)
    parser.add_argument("--audit-rows", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=200, help="pages timed per walk")
    parser.add_argument("--web-rounds", type=int, default=20)


SCENARIO = Scenario(
    "listings",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda _: (ADDRESS,),
)
