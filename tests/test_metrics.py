"""`/metrics`, `/healthz` and `/readyz` (127.0.0.217 and .218): one real server on .217 for
the file, scraped with curl and no client certificate, parsed by prometheus_client's own
parser; a real agent joins and is blocked, an edge client is refused, the Temporal host is
killed. The readiness check, the node counts' cache and the event-loop lag are also
driven directly, on Trio's mock clock where time matters."""

from __future__ import annotations

import json
import os
import secrets
import signal
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from fixtures import edge_client, metrics, operator_certs
from fixtures.agent import AgentProcess, connected
from fixtures.cluster import Served
from fixtures.polling import wait_until
from fixtures.postgres import admin_url
from oz0 import __version__
from oz0.server import loop_lag
from oz0.server.cluster_counts import MAX_AGE, ClusterCounts
from oz0.server.metrics import EXPOSITION_MAX_AGE, ServerMetrics
from oz0.server.readiness import HEARTBEAT_STALE, Readiness
from oz0.store.pool import open_database
from tests.conftest import CliRunner

SERVER, UNREACHABLE = "127.0.0.217", "127.0.0.218"
# The module's one server (`served`, tests/conftest.py), with the edge's reconcile backstop
# once a minute: a block's stream is then ended by its notification alone, which the count
# of read-backs shows.
ADVERTISE = SERVER
SERVER_ARGS = ("--reconcile-every", "60")
EDGE = f"{SERVER}:7443"
# Labels the server's own metrics may carry without sign-in: none names a node, a token,
# a server or a tenant.
OUR_LABELS = {"state", "reason", "cap", "version", "le"}


sample = metrics.value


# How long a scrape may lag what happened (the node counts are cached 5 s).
SCRAPE_BOUND = 20.0


def token(cli: CliRunner, env: dict[str, str]) -> dict[str, Any]:
    created = cli("token", "create", "--tenant", "default", "--json", env=env)
    assert created.code == 0, created.err
    value: dict[str, Any] = created.json()
    return value


def test_metrics_need_no_certificate_and_label_nothing_but_states_and_reasons(
    served: Served,
) -> None:
    code, _, body = metrics.get(SERVER, "/metrics")
    assert code == 200, body
    families = {f.name: f for f in text_string_to_metric_families(body)}
    ours = {name for name in families if name.startswith("oz0_")}
    assert {
        "oz0_build_info", "oz0_nodes", "oz0_nodes_age_seconds", "oz0_edge_streams_open",
        "oz0_edge_joins", "oz0_edge_join_refusals", "oz0_edge_block_to_close_seconds",
        "oz0_temporal_host_state", "oz0_temporal_host_restarts", "oz0_db_pool_in_use",
        "oz0_db_pool_size", "oz0_db_pool_max_size", "oz0_db_pool_waiting",
        "oz0_worker_threads_in_use", "oz0_worker_threads_waiting",
        "oz0_event_loop_lag_seconds", "oz0_event_loop_lag_last_seconds",
        "oz0_membership_heartbeat_age_seconds", "oz0_edge_node_rereads",
        "oz0_prune_passes", "oz0_pruned_jobs", "oz0_pruned_attempts", "oz0_pruned_output_rows",
        "oz0_pruned_audit_rows", "oz0_servers_up", "oz0_jobs", "oz0_jobs_oldest_queued_seconds",
        "oz0_jobs_oldest_unstarted_seconds", "oz0_job_duration_seconds", "oz0_job_wait_seconds",
        "oz0_person_caps_hit",
    } <= ours, sorted(ours)  # fmt: skip
    for name in ours:
        for s in families[name].samples:
            assert set(s.labels) <= OUR_LABELS, (name, s.labels)
    assert "process_resident_memory_bytes" in families


def test_tenant_names_are_shown_only_to_an_operator_certificate_and_only_its_tenants(
    cli: CliRunner, served: Served, tmp_path: Path
) -> None:
    files = served.files
    assert cli("tenant", "create", "acme", env=files.cli_env).code == 0
    main = files.main_db
    # A pending node in acme and one in default.
    node_ids = {tenant: "node-" + secrets.token_hex(6) for tenant in ("acme", "default")}
    with psycopg.connect(main, autocommit=True) as conn:
        for tenant, node_id in node_ids.items():
            conn.execute(
                "INSERT INTO nodes (id, tenant, state, labels, hostname, public_key_sha256)"
                " VALUES (%s, %s, 'pending', '{}', '', %s)",
                (node_id, tenant, secrets.token_hex(32)),
            )
    try:
        admin = operator_certs.OperatorFiles(files.context_dir)
        viewer = operator_certs.issue(
            files, "acme-viewer", tmp_path / "viewer", SERVER, role="viewer", tenants=("acme",)
        )
        as_admin = wait_until(
            lambda: (s := scrape_as(admin)) and tenant_nodes(s, "acme") == 1 and s,
            SCRAPE_BOUND,
            "the admin's scrape counting acme's pending node",
            step=0.3,
        )
        assert tenant_nodes(as_admin, "default") == 1, "a cluster-wide admin sees every tenant"
        as_viewer = scrape_as(viewer)
        assert tenant_nodes(as_viewer, "acme") == 1
        assert tenant_nodes(as_viewer, "default") is None, "default is not the viewer's"
        code, _, body = metrics.get(SERVER, "/metrics")
        assert code == 200 and "acme" not in body and 'tenant="' not in body, body
        assert "oz0_tenant_nodes" not in body
        assert (sample(metrics.scrape(SERVER), "oz0_nodes", state="pending") or 0) >= 2, (
            "counted, unnamed"
        )
        # A certificate that is not current any more is a stranger's.
        operator_certs.remove(files, "acme-viewer")
        code, _, body = metrics.get(SERVER, "/metrics", *viewer.curl_args)
        assert code == 200 and "acme" not in body, body
    finally:
        with psycopg.connect(main, autocommit=True) as conn:
            conn.execute("DELETE FROM nodes WHERE id = ANY(%s)", (list(node_ids.values()),))


def scrape_as(who: operator_certs.OperatorFiles) -> metrics.Samples:
    code, _, body = metrics.get(SERVER, "/metrics", *who.curl_args)
    assert code == 200, body
    return metrics.parse(body)


def tenant_nodes(samples: metrics.Samples, tenant: str) -> float | None:
    return sample(samples, "oz0_tenant_nodes", tenant=tenant, state="pending")


def test_the_scrape_shows_the_pool_temporal_the_heartbeat_and_the_event_loop(
    served: Served,
) -> None:
    samples = wait_until(
        lambda: (
            (s := metrics.scrape(SERVER))
            and (sample(s, "oz0_event_loop_lag_seconds_count") or 0) > 0
            and s
        ),
        SCRAPE_BOUND,
        "a scrape with the event loop's lag measured",
        step=0.3,
    )
    assert sample(samples, "oz0_build_info", version=__version__) == 1
    assert sample(samples, "oz0_temporal_host_state", state="serving") == 1
    assert sample(samples, "oz0_temporal_host_state", state="restarting") == 0
    assert sample(samples, "oz0_temporal_host_restarts_total") == 0
    in_use = sample(samples, "oz0_db_pool_in_use")
    size = sample(samples, "oz0_db_pool_size")
    assert in_use is not None and size is not None
    assert 0 <= in_use <= size <= 8
    assert sample(samples, "oz0_db_pool_max_size") == 8
    assert sample(samples, "oz0_db_pool_waiting") == 0
    age = sample(samples, "oz0_membership_heartbeat_age_seconds")
    assert age is not None and 0 <= age < HEARTBEAT_STALE


def test_healthz_and_readyz_answer_without_a_certificate(served: Served) -> None:
    code, content_type, body = metrics.get(SERVER, "/healthz")
    assert (code, json.loads(body)) == (200, {"status": "serving"})
    code, content_type, body = metrics.get(SERVER, "/readyz")
    assert (code, json.loads(body)) == (200, {"ready": True}), body
    assert content_type == "application/json"


def test_a_join_and_a_block_move_joins_streams_nodes_and_the_close_latency(
    cli: CliRunner, served: Served, agents: list[AgentProcess], tmp_path: Path
) -> None:
    files = served.files
    env = files.cli_env
    before = metrics.scrape(SERVER)

    def joins(s: dict[Any, float]) -> float:
        return sample(s, "oz0_edge_joins_total", state="accepted") or 0

    def streams(s: dict[Any, float]) -> float:
        return sample(s, "oz0_edge_streams_open") or 0

    def nodes(s: dict[Any, float], state: str) -> float:
        return sample(s, "oz0_nodes", state=state) or 0

    def closed(s: dict[Any, float]) -> float:
        return sample(s, "oz0_edge_block_to_close_seconds_count", state="blocked") or 0

    def rereads(s: dict[Any, float]) -> float:
        return sample(s, "oz0_edge_node_rereads_total") or 0

    created = token(cli, env)
    agent = AgentProcess.joining(
        tmp_path / "node", [EDGE], files.ca_hash, token=created["token"]
    ).start()
    agents.append(agent)
    node_id = agent.wait_status(connected, timeout=30)["node_id"]
    joined = wait_until(
        lambda: (
            (s := metrics.scrape(SERVER)) and nodes(s, "accepted") > nodes(before, "accepted") and s
        ),
        SCRAPE_BOUND,
        "a scrape counting one more accepted node",
        step=0.3,
    )
    assert joins(joined) == joins(before) + 1
    assert streams(joined) == streams(before) + 1
    _, _, body = metrics.get(SERVER, "/metrics")
    assert node_id not in body and created["id"] not in body
    assert created["token"] not in body

    blocked = cli("node", "block", node_id, "--reason", "metrics", env=env)
    assert blocked.code == 0, blocked.err
    after = wait_until(
        lambda: (s := metrics.scrape(SERVER)) and closed(s) == closed(before) + 1
        and streams(s) == streams(before) and s,
        SCRAPE_BOUND, "a scrape with the blocked node's stream closed", step=0.3,
    )  # fmt: skip
    fast = sample(after, "oz0_edge_block_to_close_seconds_bucket", state="blocked", le="2.0")
    assert fast == closed(before) + 1, "a block closes its stream within 2 s"
    # The notification said the node is blocked now (migration 0013): no read back.
    assert rereads(after) == rereads(before)
    assert wait_until(
        lambda: nodes(metrics.scrape(SERVER), "blocked") == nodes(before, "blocked") + 1,
        SCRAPE_BOUND,
        "a scrape counting one more blocked node",
        step=0.3,
    )


def test_a_join_with_a_bad_token_counts_one_refusal_and_no_join(served: Served) -> None:
    def counted() -> tuple[float, float]:
        samples = metrics.scrape(SERVER)
        joins = sum(v for (name, _), v in samples.items() if name == "oz0_edge_joins_total")
        refused = sample(samples, "oz0_edge_join_refusals_total", reason="unknown") or 0
        return refused, joins

    before = counted()

    async def join() -> dict[str, Any]:
        ca_pem, _ = await edge_client.fetch_ca(EDGE)
        keys = edge_client.NodeKeys.new()
        keys.ca_pem = ca_pem
        return await edge_client.join(EDGE, keys, token="oz0_" + secrets.token_hex(16))

    answer = trio.run(join)
    assert answer.get("code") == "token_refused", answer
    # Scrapes within a second get the same text: the refusal shows in the next one.
    assert wait_until(lambda: counted() != before, 5, "a scrape with the refusal", step=0.3)
    assert counted() == (before[0] + 1, before[1])


def test_a_killed_temporal_host_counts_a_restart_and_the_server_is_unready_meanwhile(
    served: Served,
) -> None:
    (host,) = served.server.children()
    os.kill(host, signal.SIGKILL)
    _, _, body = wait_until(
        lambda: (a := metrics.get(SERVER, "/readyz"))[0] == 503 and a,
        10,
        "/readyz answering 503",
        step=0.3,
    )
    assert json.loads(body) == {"ready": False, "reasons": ["Temporal is restarting"]}
    samples = wait_until(
        lambda: (
            (s := metrics.scrape(SERVER))
            and sample(s, "oz0_temporal_host_restarts_total") == 1
            and s
        ),
        5,
        "a scrape counting the Temporal host's restart",
        step=0.3,
    )
    assert sample(samples, "oz0_temporal_host_state", state="restarting") == 1
    assert metrics.get(SERVER, "/healthz")[0] == 200
    wait_until(
        lambda: metrics.get(SERVER, "/readyz")[0] == 200,
        60,
        "/readyz answering 200 again",
        step=0.3,
    )
    assert wait_until(
        lambda: sample(metrics.scrape(SERVER), "oz0_temporal_host_state", state="serving") == 1,
        5,
        "a scrape with the Temporal host serving",
        step=0.3,
    )


async def test_readiness_names_each_thing_that_is_not_ready() -> None:
    # On the real clock: the database's answer comes from a worker thread, which a mock
    # clock would not wait for before jumping to the check's deadline.
    age: list[float | None] = [0.5]
    state = ["serving"]
    async with open_database(admin_url(), min_size=0, max_size=1) as db:
        ready = Readiness(db, lambda: age[0], lambda: state[0])
        assert await ready.why_not() == []
        age[0], state[0] = HEARTBEAT_STALE + 0.1, "starting"
        assert await ready.why_not() == [
            "this server's membership heartbeat is not fresh",
            "Temporal is starting",
        ]
        age[0] = None
        assert "this server's membership heartbeat is not fresh" in await ready.why_not()
    # Nothing listens on this address: the pool finds no connection.
    unreachable = f"postgresql://postgres:x@{UNREACHABLE}:5432/postgres"
    async with open_database(unreachable, min_size=0, max_size=1) as db:
        ready = Readiness(db, lambda: 0.0, lambda: "serving")
        assert await ready.why_not() == ["the database does not answer"]


async def test_node_counts_are_read_again_only_once_they_are_old(
    served: Served, autojump_clock: trio.testing.MockClock
) -> None:
    main = served.files.main_db
    node_id = "node-" + secrets.token_hex(6)
    async with open_database(main, min_size=0, max_size=1) as db:
        counts = ClusterCounts(db)
        first = dict((await counts.fresh()).nodes)
        with psycopg.connect(main, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO nodes (id, tenant, state, labels, hostname, public_key_sha256)"
                " VALUES (%s, 'default', 'pending', '{}', '', %s)",
                (node_id, secrets.token_hex(32)),
            )
            try:
                assert (await counts.fresh()).nodes == first
                autojump_clock.jump(MAX_AGE - 0.1)
                assert (await counts.fresh()).nodes == first
                autojump_clock.jump(0.1)
                again = (await counts.fresh()).nodes
                assert (
                    again.get(("default", "pending"), 0) == first.get(("default", "pending"), 0) + 1
                )
            finally:
                conn.execute("DELETE FROM nodes WHERE id = %s", (node_id,))


async def test_the_event_loop_lag_is_how_late_a_sleeper_wakes(
    autojump_clock: trio.testing.MockClock,
) -> None:
    lags: list[float] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(loop_lag.watch, lags.append)
        await trio.sleep(1.2)
        # A task that holds the thread for 0.6 s, from 1.2 s into the watch: the waking
        # due at 1.5 s comes at 1.8 s.
        autojump_clock.jump(0.6)
        await trio.sleep(0.6)
        nursery.cancel_scope.cancel()
    assert lags == [0.0, 0.0, pytest.approx(0.3), 0.0]


async def test_scrapes_within_a_second_get_the_same_text(
    served: Served, autojump_clock: trio.testing.MockClock
) -> None:
    main = served.files.main_db
    async with open_database(main, min_size=0, max_size=1) as db:
        recorded = ServerMetrics(db)
        first = await recorded.exposition()
        recorded.edge.join_refused("expired")
        autojump_clock.jump(EXPOSITION_MAX_AGE - 0.1)
        assert await recorded.exposition() == first
        autojump_clock.jump(0.1)
        text = (await recorded.exposition()).decode()
    assert 'oz0_edge_join_refusals_total{reason="expired"} 1.0' in text
