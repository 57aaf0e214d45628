"""Join floods and refusal floods (issue 9, item 6): pending nodes are capped cluster-wide,
refused joins reach the audit log at a bounded rate, and a node's unsolicited purge
refusals reach it not at all."""

from __future__ import annotations

import os
import secrets
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing

from fixtures import edge_client
from fixtures.cluster import REPO, ClusterFiles, StartServer, cli_command
from fixtures.edge_client import NodeKeys, next_non_heartbeat, verified_command
from oz0 import audit
from oz0.server.edge.join_refusals import JoinRefusals
from oz0.store.pool import open_database
from tests.conftest import CliRunner

SERVER = "127.0.0.82"
ADVERTISE = SERVER  # the suite's cluster_files (tests/conftest.py)
EDGE = f"{SERVER}:7443"
LIMIT = 3
EDGE_ACTOR = audit.Actor("server", "server-000000000000")


async def cli_json(cli: CliRunner, cluster_env: dict[str, str], *args: str) -> Any:
    done = await trio.to_thread.run_sync(lambda: cli(*args, "--json", env=cluster_env))
    assert done.code == 0, done.err
    return done.json()


async def pinned() -> NodeKeys:
    keys = NodeKeys.new()
    keys.ca_pem, _ = await edge_client.fetch_ca(EDGE)
    return keys


def refused_rows(cluster_files: ClusterFiles) -> list[audit.Entry]:
    with psycopg.connect(cluster_files.main_db) as conn:
        return audit.entries(conn, action="node.join.refused", limit=1000)


@pytest.mark.parametrize(
    ("value", "code", "error"),
    [
        ("0", 1, "error: --max-pending-nodes must be 1 to 1000000, not 0"),
        ("1000001", 1, "error: --max-pending-nodes must be 1 to 1000000, not 1000001"),
        ("many", 2, "error: Invalid value for --max-pending-nodes:"
                    ' unable to convert "many" into int.'),
    ],
)  # fmt: skip
def test_max_pending_nodes_out_of_range_is_one_line_and_starts_nothing(
    cluster_files: ClusterFiles, cluster_env: dict[str, str], value: str, code: int, error: str
) -> None:
    # A process of its own, as an operator runs it: were the value taken, the server would
    # start and run (and is then stopped as an operator would, its Temporal host with it).
    process = subprocess.Popen(
        cli_command(
            "server", "start", "--master-key-file", str(cluster_files.master_key),
            "--advertise", SERVER, "--listen", SERVER, "--max-pending-nodes", value,
        ),
        env={**os.environ, **cluster_env, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        process.terminate()
        process.communicate(timeout=30)
        raise AssertionError(f"--max-pending-nodes {value} was taken: the server ran") from None
    assert (process.returncode, err, out) == (code, error + "\n", "")
    with psycopg.connect(cluster_files.main_db) as conn:
        assert conn.execute("SELECT count(*) FROM servers").fetchone() == (0,)


async def test_pending_nodes_are_capped_and_refused_joins_audited_at_a_bounded_rate(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    server = start_server(cluster_files, SERVER, "--max-pending-nodes", str(LIMIT))
    answers: list[dict[str, Any]] = []

    async def join(token: str | None = None) -> None:
        answers.append(await edge_client.join(EDGE, await pinned(), token=token))

    # Concurrent joins cannot pass the limit together.
    async with trio.open_nursery() as nursery:
        for _ in range(10):
            nursery.start_soon(join)
    joined = [a for a in answers if a["type"] == "joined"]
    refused = [a for a in answers if a["type"] == "error"]
    assert len(joined) == LIMIT and {a["state"] for a in joined} == {"pending"}
    assert len(refused) == 10 - LIMIT
    assert refused[0] == {
        "type": "error",
        "code": "pending_limit",
        "message": f"this cluster already has {LIMIT} nodes waiting for an operator, its limit;"
        " ask an operator to accept or reject some, or join with a token",
    }
    assert len(await cli_json(cli, cluster_env, "node", "list", "--state", "pending")) == LIMIT

    # A token still gets a node in; an operator's decision makes room for one more.
    created = await cli_json(cli, cluster_env, "token", "create", "--tenant", "default")
    answers.clear()
    await join(created["token"])
    assert answers[-1]["state"] == "accepted"
    rejected = await trio.to_thread.run_sync(
        lambda: cli("node", "reject", joined[0]["node_id"], env=cluster_env)
    )
    assert rejected.code == 0, rejected.err
    await join()
    await join()
    assert [a.get("state") or a["code"] for a in answers[-2:]] == ["pending", "pending_limit"]

    # A flood of refusals (over the limit, and with made-up tokens) is audited one by one
    # up to the budget; the rest are summed into one row, written here when the server stops.
    flood = 40
    async with trio.open_nursery() as nursery:
        for i in range(flood):
            nursery.start_soon(join, None if i % 2 else f"tok-{secrets.token_hex(6)}.x")
    assert all(a["type"] == "error" for a in answers[-flood:])
    total = 10 - LIMIT + 1 + flood
    one_by_one = refused_rows(cluster_files)
    assert len(one_by_one) == 20
    pending_rows = [r for r in one_by_one if r.details["reason"] == "pending_limit"]
    assert pending_rows and pending_rows[0].target == "cluster"
    assert pending_rows[0].details == {
        "reason": "pending_limit",
        "limit": LIMIT,
        "hostname": "test-host",
    }
    server.stop()
    rows = refused_rows(cluster_files)
    summaries = [r for r in rows if r.details.get("summary")]
    assert len(rows) == 21 and len(summaries) == 1
    summary = summaries[0]
    assert summary.target.startswith("edge:server-") and summary.actor_kind == "server"
    assert summary.details["count"] == total - 20 and summary.details["seconds"] == 60
    assert sum(summary.details["reasons"].values()) == total - 20
    assert set(summary.details["reasons"]) <= {"pending_limit", "unknown"}


@pytest.fixture
def database_url(cluster_files: ClusterFiles) -> Iterator[str]:
    yield cluster_files.main_db


async def test_refusals_over_the_budget_become_one_summary_row_per_interval(
    database_url: str, mock_clock: trio.testing.MockClock
) -> None:
    def write(reason: str) -> Callable[[psycopg.Connection[Any]], None]:
        return lambda conn: audit.record(
            conn, EDGE_ACTOR, "node.join.refused", "cluster", {"reason": reason}
        )

    def rows() -> list[audit.Entry]:
        with psycopg.connect(database_url) as conn:
            return list(reversed(audit.entries(conn, action="node.join.refused")))

    async def rows_when(count: int) -> list[audit.Entry]:
        for _ in range(500):
            found = await trio.to_thread.run_sync(rows)
            if len(found) >= count:
                return found
            await trio.testing.wait_all_tasks_blocked()
        raise AssertionError(f"never {count} rows: {found}")

    async with open_database(database_url) as db, trio.open_nursery() as nursery:
        refusals = JoinRefusals(db, EDGE_ACTOR, every=60, each=2)
        await nursery.start(refusals.run)
        for reason in ("unknown", "pending_limit", "unknown", "pending_limit", "unknown"):
            await refusals.refused(reason, write(reason))
        assert [r.details for r in await trio.to_thread.run_sync(rows)] == [
            {"reason": "unknown"},
            {"reason": "pending_limit"},
        ]
        mock_clock.jump(60)
        found = await rows_when(3)
        assert found[2].details == {
            "summary": True,
            "count": 3,
            "reasons": {"unknown": 2, "pending_limit": 1},
            "seconds": 60,
        }
        assert found[2].target == f"edge:{EDGE_ACTOR.name}"
        # A new interval, a new budget; a quiet interval writes nothing.
        await refusals.refused("unknown", write("unknown"))
        assert len(await trio.to_thread.run_sync(rows)) == 4
        mock_clock.jump(60)
        await trio.testing.wait_all_tasks_blocked()
        mock_clock.jump(60)
        await trio.testing.wait_all_tasks_blocked()
        assert len(await trio.to_thread.run_sync(rows)) == 4
        nursery.cancel_scope.cancel()


async def test_only_answers_to_a_purge_command_this_edge_sent_are_audited(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, SERVER)
    created = await cli_json(cli, cluster_env, "token", "create", "--tenant", "default")
    keys = await pinned()
    assert (await edge_client.join(EDGE, keys, token=created["token"]))["state"] == "accepted"

    async def purge_refusals() -> list[dict[str, Any]]:
        rows = await cli_json(cli, cluster_env, "audit", "list", "--action", "node.purge.refused")
        return [r for r in rows if r["target"] == f"node:{keys.node_id}"]

    async with edge_client.control(EDGE, keys) as (ws, welcome):
        assert welcome["type"] == "welcome"
        for _ in range(200):
            await edge_client.send(
                ws, "purge_refused", nonce=secrets.token_hex(16), reason="nobody asked"
            )
        await trio.sleep(2)
        assert await purge_refusals() == []

        purging = await trio.to_thread.run_sync(
            lambda: cli("node", "purge", keys.node_id, "--yes", env=cluster_env)
        )
        assert purging.code == 0, purging.err
        with trio.fail_after(10):
            command = verified_command(await next_non_heartbeat(ws), keys.ca_pem)
        # An answer naming another command is no answer to this one: not recorded, and the
        # edge still waits for the real one.
        await edge_client.send(ws, "purge_refused", nonce="0" * 32, reason="not this one")
        await edge_client.send(ws, "purge_refused", nonce=command["nonce"], reason="no")
        with trio.fail_after(10):
            refused = await next_non_heartbeat(ws)
        assert refused["type"] == "refused" and refused["code"] == "purging"
    rows = await purge_refusals()
    assert [(r["details"]["nonce"], r["details"]["reason"]) for r in rows] == [
        (command["nonce"], "no")
    ]
