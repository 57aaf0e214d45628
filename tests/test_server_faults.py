"""Faults a cluster must outlive, with real servers and real agents: its database
restarted, every connection of ours terminated as a failover would, a server SIGKILLed.

The database tests' cluster lives in a PostgreSQL of this file's own
(fixtures/private_postgres.py, port 5440) so that it can be restarted; servers on
127.0.0.101 and 127.0.0.102.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import re
import signal
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio

from fixtures import edge_client, private_postgres
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, StartServer, initialise
from fixtures.polling import seconds_until, wait_until
from oz0.store.dburl import DatabaseUrl
from oz0.store.pool import open_database
from tests.conftest import CliRunner

ADDRESSES = ("127.0.0.101", "127.0.0.102")
EDGES = [f"{a}:7443" for a in ADDRESSES]
PORT = 5440
AGENTS = 20
# What the issue promises after the database is back; measured, then asserted generously
# only where the promise itself is the bound.
RECONNECT_BOUND = 15.0
BLOCK_BOUND = 2.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not private_postgres.available(), reason="needs Debian's PostgreSQL binaries"
    ),
]


@pytest.fixture
def own_postgres() -> Iterator[private_postgres.PrivatePostgres]:
    with private_postgres.private_postgres(PORT) as server:
        yield server


@pytest.fixture
def outage_cluster(
    tmp_path: Path, own_postgres: private_postgres.PrivatePostgres
) -> tuple[ClusterFiles, dict[str, str]]:
    url = DatabaseUrl.parse(f"postgresql://postgres@127.0.0.1:{PORT}/oz0")
    files = initialise(tmp_path, url, advertise=ADDRESSES[0])
    env = files.cli_env
    return files, env


async def join_without_token(edge: str) -> dict[str, Any]:
    keys = edge_client.NodeKeys.new()
    keys.ca_pem, _ = await edge_client.fetch_ca(edge)
    return await edge_client.join(edge, keys)


def stream_down(agent: AgentProcess) -> bool:
    return agent.reported().get("connected") is False


def test_servers_outlive_a_database_restart_and_terminated_connections(
    cli: CliRunner,
    outage_cluster: tuple[ClusterFiles, dict[str, str]],
    own_postgres: private_postgres.PrivatePostgres,
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    files, env = outage_cluster
    servers = [start_server(files, address) for address in ADDRESSES]
    created = cli("token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=env)
    assert created.code == 0, created.err
    token = created.json()["token"]
    for i in range(AGENTS + 2):
        # Half start at each server, so both carry streams through the outage.
        edges = EDGES if i % 2 == 0 else EDGES[::-1]
        agent = AgentProcess.joining(tmp_path / f"node-{i}", edges, files.ca_hash, token=token)
        agents.append(agent.start())

    def listed() -> list[dict[str, Any]]:
        result = cli("node", "list", "--json", env=env)
        assert result.code == 0, result.err
        nodes: list[dict[str, Any]] = result.json()
        return nodes

    def connected_ids(since: dt.datetime | None = None) -> set[str]:
        """Nodes shown connected (and, with SINCE, heard from after it)."""
        return {
            n["id"]
            for n in listed()
            if n["connected"]
            and (since is None or dt.datetime.fromisoformat(n["last_seen"]) > since)
        }

    def all_heard_from(since: dt.datetime) -> bool:
        return set(kept) <= connected_ids(since)

    def database_now() -> dt.datetime:
        with own_postgres.connection() as conn:
            row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    # Printed at the end: the in-process CLI captures stdout meanwhile.
    measured: list[str] = []
    took = seconds_until(lambda: len(connected_ids()) == AGENTS + 2, 120, "every agent connected")
    measured.append(f"{AGENTS + 2} agents started and connected in {took:.1f} s")
    ids = [a.wait_reported(lambda s: bool(s.get("node_id")), 10)["node_id"] for a in agents]
    by_server = {n["server"] for n in listed()}
    assert len(by_server) == 2, "both servers carry streams"
    kept = ids[:AGENTS]

    for phase, blocked_before, blocked_after in (
        ("restart", AGENTS, AGENTS + 1),
        ("terminate", None, None),
    ):
        if blocked_before is not None:
            # Committed just before the outage: its notification may be lost with it.
            node = ids[blocked_before]
            assert cli("node", "block", node, "--reason", "before", env=env).code == 0
            own_postgres.stop()
            # While it is down, commands fail soon with one line, and make nothing.
            for command in (("node", "list"), ("token", "create", "--tenant", "default")):
                began = time.monotonic()
                down = cli(*command, env=env)
                took = time.monotonic() - began
                assert down.code == 1 and down.err.count("\n") == 1, down
                assert "database is unavailable" in down.err, down.err
                measured.append(f"{' '.join(command)}, database down: failed in {took:.1f} s")
                assert took < 10
            # A join meanwhile is told to come back, not let in unchecked nor failed.
            answer = trio.run(join_without_token, EDGES[0])
            assert answer["type"] == "error" and answer["code"] == "unavailable", answer
            own_postgres.start()
            tokens = cli("token", "list", "--json", env=env).json()
            assert len(tokens) == 1, "the token create that failed made nothing"
        else:
            assert own_postgres.terminate_backends() > 0
        back = database_now()
        for server in servers:
            assert server.process is not None and server.process.poll() is None, (
                f"a server exited after the database {phase}:\n{server.stderr()}"
            )
        took = seconds_until(
            partial(all_heard_from, since=back),
            RECONNECT_BOUND,
            f"all {AGENTS} nodes connected and heard from after the {phase}",
        )
        measured.append(f"{phase}: {AGENTS} nodes shown connected {took:.1f} s after it")
        if blocked_before is not None:
            blocked_agent = agents[blocked_before]
            wait_until(
                partial(stream_down, blocked_agent),
                10,
                "the block committed before the restart ended its stream",
            )
        if blocked_after is not None:
            node = ids[blocked_after]
            target = agents[blocked_after]
            assert target.reported().get("connected") is True
            issued = time.monotonic()
            result = cli("node", "block", node, "--reason", "after", env=env)
            assert result.code == 0, result.err
            wait_until(
                partial(stream_down, target), 10, "a block after the restart closed the stream"
            )
            closed = time.monotonic() - issued
            measured.append(f"{phase}: a later block closed the stream in {closed:.2f} s")
            assert closed < BLOCK_BOUND
        # No agent had to reconnect: the streams outlived the outage.
        for agent in agents[:AGENTS]:
            assert agent.running() and agent.reported().get("connected") is True
            assert agent.log().count("control stream up") == 1, agent.log()

    print("\n".join(measured))
    for server in servers:
        log = server.stderr()
        assert "Traceback" not in log, log
        # One line per loop and outage, not one per try.
        failures = re.findall(r"WARNING (\S+): (.*) failed, retrying", log)
        assert len(failures) <= 20, failures
        for loop in {what for _, what in failures}:
            assert sum(what == loop for _, what in failures) <= 2, (loop, failures)


def test_a_killed_servers_nodes_move_to_the_survivor_and_it_leaves_cluster_info(
    cli: CliRunner,
    pg_url: DatabaseUrl,
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    cluster_files = initialise(tmp_path, pg_url, advertise=ADDRESSES[0])
    # The CLI must reach the survivor when the first server is gone.
    context = json.loads(cluster_files.context_path.read_text())
    context["servers"] = [f"{address}:8443" for address in ADDRESSES]
    cluster_files.context_path.write_text(json.dumps(context))
    cluster_env = cluster_files.cli_env
    victim, survivor = (start_server(cluster_files, address) for address in ADDRESSES)
    created = cli(
        "token", "create", "--tenant", "default", "--max-uses", "0", "--json", env=cluster_env
    )
    assert created.code == 0, created.err
    token = created.json()["token"]
    for i in range(6):
        # All start on the victim: it is first in every agent's list.
        agent = AgentProcess.joining(
            tmp_path / f"node-{i}", EDGES, cluster_files.ca_hash, token=token
        )
        agents.append(agent.start())

    def nodes() -> list[dict[str, Any]]:
        listed: list[dict[str, Any]] = cli("node", "list", "--json", env=cluster_env).json()
        return listed

    def servers() -> dict[str, str]:
        info = cli("cluster", "info", "--json", env=cluster_env).json()
        return {s["advertise"]: s["id"] for s in info["servers"]}

    wait_until(
        lambda: (
            len(nodes()) == 6
            and all(n["connected"] and n["server"] == servers().get(ADDRESSES[0]) for n in nodes())
        ),
        90,
        "every agent connected to the first server",
    )
    ids = servers()
    # One machine frozen at the same moment: it cannot move, so only its silence shows.
    frozen = agents[-1]
    frozen_id = frozen.wait_status(lambda s: bool(s.get("node_id")), 10)["node_id"]
    assert frozen.process is not None
    frozen.process.send_signal(signal.SIGSTOP)
    try:
        victim.stop(signal.SIGKILL)
        killed = time.monotonic()
        left = seconds_until(
            lambda: ADDRESSES[0] not in servers(), 15, "the killed server left cluster info"
        )
        shown = {n["id"]: n for n in nodes()}
        assert shown[frozen_id]["connected"] is False, "not shown connected to a dead server"
        assert not [n for n in shown.values() if n["server"] == ids[ADDRESSES[0]]]
        wait_until(
            lambda: all(
                n["connected"] and n["server"] == ids[ADDRESSES[1]]
                for n in nodes()
                if n["id"] != frozen_id
            ),
            30,
            "every other node connected to the survivor",
        )
        moved = time.monotonic() - killed
    finally:
        frozen.process.send_signal(signal.SIGCONT)
    print(f"killed server: left cluster info after {left:.1f} s, its nodes moved in {moved:.1f} s")
    assert moved < 15
    assert survivor.process is not None and survivor.process.poll() is None


async def test_the_pool_is_back_within_seconds_of_the_database_after_a_long_outage(
    own_postgres: private_postgres.PrivatePostgres,
) -> None:
    async with open_database(own_postgres.admin_url) as db:

        def ping(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute("SELECT 1").fetchone()
            return int(row[0]) if row else 0

        assert await db.transaction(ping) == 1
        await trio.to_thread.run_sync(own_postgres.stop)
        # Queries keep coming during the outage, as the servers' loops send them.
        async with trio.open_nursery() as nursery:

            async def keep_asking() -> None:
                while True:
                    with contextlib.suppress(psycopg.OperationalError):
                        await db.transaction(ping)
                    await trio.sleep(0.5)

            for _ in range(3):
                nursery.start_soon(keep_asking)
            await trio.sleep(20)
            nursery.cancel_scope.cancel()
        await trio.to_thread.run_sync(own_postgres.start)
        back = trio.current_time()
        while True:
            try:
                await db.transaction(ping)
                break
            except psycopg.OperationalError:
                await trio.sleep(0.1)
        took = trio.current_time() - back
        print(f"pool back {took:.2f} s after the database, after a 20 s outage")
        assert took < 3, f"the pool needed {took:.1f} s"
