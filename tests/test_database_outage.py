"""Servers outlive their database: a PostgreSQL restart, and every connection of ours
terminated as a failover would, with two servers and 20 real agents.

The cluster lives in a PostgreSQL of this file's own (fixtures/private_postgres.py, port
5440) so that it can be restarted; servers on 127.0.0.101 and 127.0.0.102.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from fixtures import private_postgres
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, ServerProcess, initialise
from oz0.store.dburl import DatabaseUrl
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
    env = {
        "OZ0_DB": files.url.conninfo,
        "XDG_CONFIG_HOME": str(files.config_home),
        "OZ0_CONTEXT": str(files.context_path),
    }
    return files, env


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    started: list[AgentProcess] = []
    yield started
    for agent in started:
        agent.stop()


def wait_until(what: str, check: Callable[[], bool], timeout: float) -> float:
    """Seconds until CHECK holds, polled every 0.2 s; fails after TIMEOUT."""
    began = time.monotonic()
    while not check():
        if time.monotonic() - began > timeout:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.2)
    return time.monotonic() - began


def stream_down(agent: AgentProcess) -> bool:
    return agent.reported().get("connected") is False


def test_servers_outlive_a_database_restart_and_terminated_connections(
    cli: CliRunner,
    outage_cluster: tuple[ClusterFiles, dict[str, str]],
    own_postgres: private_postgres.PrivatePostgres,
    start_server: Callable[..., ServerProcess],
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

    def connected_ids() -> set[str]:
        return {n["id"] for n in listed() if n["connected"]}

    wait_until("every agent connected", lambda: len(connected_ids()) == AGENTS + 2, 120)
    ids = [a.wait_status(lambda s: bool(s.get("node_id")), 10)["node_id"] for a in agents]
    by_server = {n["server"] for n in listed()}
    assert len(by_server) == 2, "both servers carry streams"
    kept = ids[:AGENTS]
    # Printed at the end: the in-process CLI captures stdout meanwhile.
    measured: list[str] = []

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
            own_postgres.start()
            tokens = cli("token", "list", "--json", env=env).json()
            assert len(tokens) == 1, "the token create that failed made nothing"
        else:
            assert own_postgres.terminate_backends() > 0
        for server in servers:
            assert server.process is not None and server.process.poll() is None, (
                f"a server exited after the database {phase}:\n{server.stderr()}"
            )
        took = wait_until(
            f"all {AGENTS} nodes connected after the {phase}",
            lambda: set(kept) <= connected_ids(),
            RECONNECT_BOUND,
        )
        measured.append(f"{phase}: {AGENTS} nodes shown connected {took:.1f} s after it")
        if blocked_before is not None:
            blocked_agent = agents[blocked_before]
            wait_until(
                "the block committed before the restart ended its stream",
                partial(stream_down, blocked_agent),
                10,
            )
        if blocked_after is not None:
            node = ids[blocked_after]
            target = agents[blocked_after]
            assert target.reported().get("connected") is True
            issued = time.monotonic()
            result = cli("node", "block", node, "--reason", "after", env=env)
            assert result.code == 0, result.err
            wait_until(
                "a block after the restart closed the stream",
                partial(stream_down, target),
                10,
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
