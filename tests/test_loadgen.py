"""The Go load generator (bench/loadgen/) against a real server on 127.0.0.223: it joins
nodes through `/join`, holds their control streams as agents do, and sees a block; with
`--run-attempts` its nodes run the parts of a `job run --all -- true`."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from bench import loadgen
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.polling import trio_until
from oz0 import audit, context, nodes, pki, tokens
from tests.conftest import CliRunner

SERVER = "127.0.0.223"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
NODES = 20
# Generous: the suite runs two files at a time on two cores.
WELCOMED_WITHIN = 60.0
BLOCKED_WITHIN = 15.0
# Nodes that run the parts of one `job run --all`.
RUNNING_NODES = 5


@pytest.fixture(scope="module")
def binary() -> Path:
    return loadgen.build()


def main_db_conn(files: ClusterFiles) -> psycopg.Connection[Any]:
    return psycopg.connect(files.main_db, autocommit=True)


def token_in_db(files: ClusterFiles) -> str:
    with main_db_conn(files) as conn, conn.transaction():
        _, token = tokens.create(
            conn,
            tenant="default",
            ttl=None,
            max_uses=0,
            labels={"from": "token"},
            description="test_loadgen",
            actor=audit.Actor("operator", "test"),
        )
    return token


def connected_nodes(files: ClusterFiles) -> set[str]:
    """The nodes `node list` shows connected: a server recorded and seen lately."""
    with main_db_conn(files) as conn:
        rows = conn.execute(
            "SELECT id FROM nodes WHERE state = 'accepted' AND server IS NOT NULL"
            " AND last_seen > now() - interval '15 seconds'"
        ).fetchall()
    return {str(r[0]) for r in rows}


def nodes_taking_attempts(files: ClusterFiles, max_jobs: int) -> set[str]:
    """The connected nodes whose latest stream said it takes attempts (`max_jobs` with
    `attempts: "stream"`), MAX_JOBS at once: placement sends them their parts over it."""
    with main_db_conn(files) as conn:
        rows = conn.execute(
            "SELECT id FROM nodes WHERE state = 'accepted' AND server IS NOT NULL"
            " AND last_seen > now() - interval '15 seconds' AND attempts_by_stream"
            " AND max_jobs = %s",
            (max_jobs,),
        ).fetchall()
    return {str(r[0]) for r in rows}


async def test_generator_joins_holds_and_sees_a_block(
    binary: Path, cluster_files: ClusterFiles, start_server: StartServer, tmp_path: Path
) -> None:
    start_server(cluster_files, SERVER)
    ca_file = cluster_files.context_dir / context.CA_FILE
    out = tmp_path / "nodes"
    token = token_in_db(cluster_files)

    # An edge whose certificate another CA issued is not one to join through.
    foreign = tmp_path / "foreign-ca.pem"
    foreign.write_bytes(pki.cert_to_pem(pki.new_ca(cluster_files.name, "cluster").cert))
    refused = await loadgen.join(EDGE, foreign, token, tmp_path / "none", nodes=2)
    assert refused["joined"] == 0
    assert refused["errors"] == {"tls:certificate": 2}

    joined = await loadgen.join(
        EDGE, ca_file, token, out, nodes=NODES, concurrency=8, labels={"role": "load"}
    )
    assert joined["joined"] == NODES, joined
    assert joined["errors"] == {}
    assert joined["latency_ms"]["p50"] > 0
    nodes_file = out / "nodes.jsonl"
    assert stat.S_IMODE(nodes_file.stat().st_mode) == 0o600
    assert token not in nodes_file.read_text()
    with main_db_conn(cluster_files) as conn:
        rows = conn.execute("SELECT id, state, labels, hostname FROM nodes").fetchall()
    ids = {str(r[0]) for r in rows}
    assert len(ids) == NODES
    assert {r[1] for r in rows} == {"accepted"}
    assert all(r[2] == {"from": "token", "role": "load"} for r in rows)
    assert {r[3] for r in rows} == {f"loadgen-{i}" for i in range(NODES)}

    async with loadgen.hold([EDGE], ca_file, out, extra=["--stats-every", "1"]) as held:
        welcomed: dict[str, dict[str, Any]] = {}
        with trio.fail_after(WELCOMED_WITHIN):
            async for event in held:
                if event["event"] == "welcome":
                    welcomed[event["node"]] = event
                if len(welcomed) == NODES:
                    break
        assert set(welcomed) == ids
        assert {e["edge"] for e in welcomed.values()} == {EDGE}
        assert abs(next(iter(welcomed.values()))["t"] - time.monotonic()) < WELCOMED_WITHIN
        # The database is polled (in a thread: a query blocks): nothing announces it here.
        await trio_until(
            lambda: connected_nodes(cluster_files) == ids,
            WELCOMED_WITHIN,
            "every generated node connected, as the database says",
            step=0.5,
            in_thread=True,
        )
        # Held as agents hold them: every stream heartbeats, and hears the edge's.
        with trio.fail_after(WELCOMED_WITHIN):
            async for event in held:
                if event["event"] == "stats" and event["heartbeats_sent"] >= NODES:
                    break
        assert event["streams_alive"] == NODES
        assert 0 < event["max_gap_s"] < 3 * 5
        assert event["ended"] == {} and event["failed"] == {}

        # Blocked through the data layer: the edge refuses the node's stream, the
        # generator says so and keeps asking, as the agent does.
        victim = sorted(ids)[0]
        with main_db_conn(cluster_files) as conn, conn.transaction():
            nodes.block(conn, victim, audit.Actor("operator", "test"), "test_loadgen")
        refusals: list[dict[str, Any]] = []
        stats: dict[str, Any] = {}
        with trio.fail_after(BLOCKED_WITHIN):
            async for event in held:
                if event["event"] == "refused":
                    refusals.append(event)
                if event["event"] == "stats":
                    stats = event
                # A second refusal: it asked again (2-4 s later) and was refused again.
                if len(refusals) >= 2 and stats.get("refused", {}).get("blocked", 0) >= 2:
                    break
        assert {(e["node"], e["code"], e["retrying"]) for e in refusals} == {
            (victim, "blocked", True)
        }
        # Asked again at the agent's pace for refusals: 2 to 4 s later, never sooner.
        assert refusals[1]["t"] - refusals[0]["t"] >= 2.0
        assert stats["streams_alive"] == NODES - 1
        assert stats["welcomed_total"] == NODES
        await trio_until(
            lambda: connected_nodes(cluster_files) == ids - {victim},
            BLOCKED_WITHIN,
            "every node but the blocked one connected, as the database says",
            step=0.5,
            in_thread=True,
        )
        summary = await held.stop()

    assert held.process.returncode == 0
    assert summary is not None
    assert summary["ended"].get("stopped") == NODES - 1
    assert summary["stop_timed_out"] is False
    assert summary["refused"]["blocked"] >= 2


async def test_bad_input_is_one_line_and_no_token_on_the_command_line(
    binary: Path, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("not a certificate\n")
    env = {k: v for k, v in os.environ.items() if k != "OZ0_JOIN_TOKEN"}
    base = [str(binary), "join", "--edge", EDGE, "--ca", str(ca), "--out", str(tmp_path / "o")]
    cases = [
        ([*base, "--nodes", "1"], "set OZ0_JOIN_TOKEN"),
        ([*base, "--nodes", "0"], "--nodes and --concurrency must be at least 1"),
        ([str(binary), "join", "--edge", "nowhere", "--ca", str(ca)], "join needs"),
        (
            [str(binary), "hold", "--edge", "x:99999", "--ca", str(ca), "--nodes-dir", "d"],
            "bad port",
        ),
        ([str(binary), "fly"], "unknown command"),
    ]
    for args, expected in cases:
        done = await trio.run_process(args, env=env, capture_stderr=True, check=False)
        lines = done.stderr.decode().splitlines()
        assert done.returncode == 2, (args, lines)
        assert len(lines) == 1 and expected in lines[0], (args, lines)
    done = await trio.run_process(
        [*base, "--nodes", "1"],
        env={**env, "OZ0_JOIN_TOKEN": "t"},
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 2
    assert "holds no PEM certificate" in done.stderr.decode()
    assert not (tmp_path / "o").exists()


async def test_generated_nodes_run_every_part_of_a_job_on_all_of_them(
    binary: Path,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    cli: CliRunner,
    tmp_path: Path,
) -> None:
    start_server(cluster_files, SERVER)
    ca_file = cluster_files.context_dir / context.CA_FILE
    out = tmp_path / "nodes"
    joined = await loadgen.join(EDGE, ca_file, token_in_db(cluster_files), out, nodes=RUNNING_NODES)
    assert joined["joined"] == RUNNING_NODES, joined
    with main_db_conn(cluster_files) as conn:
        ids = {str(r[0]) for r in conn.execute("SELECT id FROM nodes").fetchall()}
    env = cluster_files.cli_env
    stats: dict[str, Any] = {}

    async def read(held: loadgen.Held) -> None:
        async for event in held:
            if event["event"] == "stats":
                stats.update(event)

    extra = ["--run-attempts", "--max-jobs", "2", "--quiet-events", "--stats-every", "0.5"]
    async with loadgen.hold([EDGE], ca_file, out, extra=extra) as held:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read, held)
            await trio_until(
                lambda: nodes_taking_attempts(cluster_files, 2) == ids,
                WELCOMED_WITHIN,
                "every generated node said it takes attempts over its stream",
                step=0.5,
                in_thread=True,
            )
            # As an operator types it; in a thread, so that the generator's lines are read.
            ran = await trio.to_thread.run_sync(
                lambda: cli("job", "run", "--all", "--", "true", env=env)
            )
            assert ran.code == 0, ran.err
            [listed] = cli("job", "list", "--json", env=env).json()
            shown = cli("job", "show", listed["id"], "--json", env=env).json()
            assert (shown["state"], shown["exit_code"], shown["all"]) == ("succeeded", 0, True)
            parts = shown["attempts"]
            assert sorted(a["node"] for a in parts) == sorted(ids), parts
            assert {(a["state"], a["exit_code"], a["ended_because"]) for a in parts} == {
                ("ended", 0, "exit")
            }, parts
            # Every end acked, none sent twice to be run twice.
            await trio_until(
                lambda: stats.get("attempts", {}).get("done_stored") == RUNNING_NODES,
                BLOCKED_WITHIN,
                "the generator heard every end stored",
            )
            nursery.cancel_scope.cancel()
        summary = await held.stop()

    assert summary is not None
    attempts = summary["attempts"]
    assert attempts["started"] == attempts["done_sent"] == RUNNING_NODES, attempts
    assert attempts["pending"] == 0 and attempts["malformed"] == 0, attempts
    # Any sent again was answered, not run again.
    again = attempts["answered_runs"] + attempts["answered_ran"]
    assert attempts["received"] == RUNNING_NODES + again, attempts
    assert summary["failed"] == {} and set(summary["ended"]) == {"stopped"}, summary
