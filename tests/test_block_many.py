"""`node block` / `node unblock` of many nodes at once, by IDs or by labels, through the real
CLI against a real server on 127.0.0.220 with real agents."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from cli.client import ApiClient, ApiError
from fixtures.agent import AgentProcess, blocked, connected
from fixtures.cluster import ClusterFiles, StartServer
from oz0 import nodes
from oz0.context import Context
from tests.conftest import CliRunner

SERVER = "127.0.0.220"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
# A block ends every stream within two seconds (docs/manage-nodes.md); the agent then says
# so. Generous: the suite runs two files at a time on two cores.
BLOCKED_WITHIN = 10.0
UNKNOWN = "node-000000000000"


def start_agents(
    cli: CliRunner,
    files: ClusterFiles,
    env: dict[str, str],
    root: Path,
    agents: list[AgentProcess],
    roles: list[str],
) -> list[tuple[AgentProcess, str]]:
    """One connected agent per role (label role=ROLE), each with a token of its own."""
    started = []
    for i, role in enumerate(roles):
        created = cli("token", "create", "--tenant", "default", "--json", env=env)
        assert created.code == 0, created.err
        agent = AgentProcess.joining(
            root / f"node-{i}",
            [EDGE],
            files.ca_hash,
            token=created.json()["token"],
            labels={"role": role},
        ).start()
        agents.append(agent)
        started.append(agent)
    return [(a, a.wait_reported(connected, timeout=60)["node_id"]) for a in started]


def audit_rows(cli: CliRunner, env: dict[str, str], action: str) -> list[dict[str, Any]]:
    found = cli("audit", "list", "--action", action, "--json", env=env)
    assert found.code == 0, found.err
    rows: list[dict[str, Any]] = found.json()
    return rows


def states(cli: CliRunner, env: dict[str, str]) -> dict[str, str]:
    listed = cli("node", "list", "--json", env=env)
    assert listed.code == 0, listed.err
    return {n["id"]: n["state"] for n in listed.json()}


def test_many_ids_and_a_selector_block_every_stream_in_one_request_or_change_nothing(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    # The reconcile backstop once a minute: the notifications alone must end the streams.
    start_server(cluster_files, SERVER, "--reconcile-every", "60")
    (web1, id1), (web2, id2), (db, id3) = start_agents(
        cli, cluster_files, cluster_env, tmp_path, agents, ["web", "web", "db"]
    )

    # All or nothing: an unknown ID anywhere in the list changes no node.
    bad = cli("node", "block", id1, UNKNOWN, id2, "--reason", "r", env=cluster_env)
    assert bad.code != 0
    assert bad.err.strip().splitlines() == [
        f"error: node {UNKNOWN} not found; nothing was changed"
    ], bad.err
    assert audit_rows(cli, cluster_env, "node.block") == []
    assert set(states(cli, cluster_env).values()) == {"accepted"}

    # Two IDs, one request: both streams end, one audit row each.
    began = time.monotonic()
    done = cli("node", "block", id1, id3, "--reason", "stolen rack", "--json", env=cluster_env)
    assert done.code == 0, done.err
    assert [(n["id"], n["state"]) for n in done.json()] == [(id1, "blocked"), (id3, "blocked")]
    web1.wait_reported(blocked, timeout=BLOCKED_WITHIN)
    db.wait_reported(blocked, timeout=BLOCKED_WITHIN)
    took = time.monotonic() - began
    assert connected(web2.reported()), "a node not named was shut out"
    rows = audit_rows(cli, cluster_env, "node.block")
    assert sorted((r["target"], r["actor"]["name"], r["details"]) for r in rows) == sorted(
        (f"node:{n}", "admin", {"reason": "stolen rack", "was": "accepted"}) for n in (id1, id3)
    )

    # A node already blocked fails the whole request, naming it; the other stays accepted.
    again = cli("node", "block", id2, id1, "--reason", "r", env=cluster_env)
    assert again.code != 0
    assert again.err.strip().splitlines() == [
        f"error: node {id1} is blocked; only pending and accepted nodes can be blocked;"
        " nothing was changed"
    ], again.err
    assert states(cli, cluster_env)[id2] == "accepted"
    assert len(audit_rows(cli, cluster_env, "node.block")) == 2

    # A selector that matches nothing is an error, and so is a tenant without nodes there.
    for extra in (["--selector", "role=nothing"], ["--selector", "role=web", "--tenant", "x"]):
        none = cli("node", "block", *extra, "--reason", "r", env=cluster_env)
        assert none.code != 0
        assert "no node matches" in none.err and len(none.err.strip().splitlines()) == 1

    # By label: the accepted node with role=web (the blocked one is not matched again).
    by_label = cli(
        "node", "block", "--selector", "role=web", "--tenant", "default", "--reason", "web tier",
        env=cluster_env,
    )  # fmt: skip
    assert by_label.code == 0, by_label.err
    assert by_label.out.strip() == f"node {id2} blocked"
    web2.wait_reported(blocked, timeout=BLOCKED_WITHIN)
    assert len(audit_rows(cli, cluster_env, "node.block")) == 3

    # Unblock by label (both web nodes), then by ID; every agent is back.
    back = cli("node", "unblock", "--selector", "role=web", env=cluster_env)
    assert back.code == 0, back.err
    assert back.out.strip() == f"2 nodes unblocked: {' '.join(sorted([id1, id2]))}"
    one = cli("node", "unblock", id3, "--json", env=cluster_env)
    assert one.code == 0 and [n["state"] for n in one.json()] == ["accepted"]
    unblocks = audit_rows(cli, cluster_env, "node.unblock")
    assert sorted(r["target"] for r in unblocks) == sorted(f"node:{n}" for n in (id1, id2, id3))
    for agent in (web1, web2, db):
        agent.wait_reported(connected, timeout=30)
    print(f"two streams ended {took:.2f} s after the CLI started")


def test_bad_many_block_requests_are_one_line_each_and_change_nothing(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
) -> None:
    start_server(cluster_files, SERVER)
    url = cluster_files.main_db
    cap, id_cap = nodes.MAX_PER_REQUEST, nodes.MAX_IDS_PER_REQUEST
    # More nodes than one request may change, all with one label (rows as joins leave them).
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nodes (id, tenant, state, labels)"
            " SELECT 'node-' || lpad(to_hex(i), 12, '0'), 'default', 'accepted', %s"
            " FROM generate_series(1, %s) AS i",
            (Jsonb({"fleet": "big"}), cap + 1),
        )
    ids = [f"node-{i:012x}" for i in range(1, cap + 2)]
    cases = [
        (("node", "block", *ids, "--reason", "r"), f"{cap + 1} nodes named; at most {id_cap}"),
        (("node", "block", "--selector", "fleet=big", "--reason", "r"), f"more than {cap} nodes"),
        (("node", "unblock", *ids[: id_cap + 1]), f"{id_cap + 1} nodes named; at most"),
        (("node", "block", "--reason", "r"), "name the nodes"),
        (("node", "block", ids[0], "--selector", "a=b", "--reason", "r"), "not both"),
        (("node", "block", ids[0], "--tenant", "default", "--reason", "r"), "--tenant goes with"),
        (("node", "block", "--selector", "fleet", "--reason", "r"), "invalid label 'fleet'"),
        (("node", "block", "--selector", "Fleet=big", "--reason", "r"), "invalid label key"),
        (("node", "block", ids[0], ids[1], "--reason", " "), "a reason is required"),
        (("node", "block", "nope", "--reason", "r"), "invalid node ID 'nope'"),
        (("node", "unblock", ids[0]), f"node {ids[0]} is accepted; only blocked nodes"),
    ]
    for args, message in cases:
        result = cli(*args, env=cluster_env)
        assert result.code != 0, args[:4]
        lines = result.err.strip().splitlines()
        assert len(lines) == 1 and message in lines[0], (args[:4], result.err)
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state <> 'accepted'),"
            " (SELECT count(*) FROM audit_log WHERE action LIKE 'node.%%') FROM nodes"
        ).fetchone()
    assert row == (0, 0)

    # Past the CLI's own check, the API refuses it too (and its body fits the 64 KiB).
    api = ApiClient(Context.load(cluster_files.context_path))
    with pytest.raises(ApiError, match=f"{id_cap + 1} nodes named; at most {id_cap}"):
        api.post("/api/v1/nodes/block", {"ids": ids[: id_cap + 1], "reason": "r"})

    # Exactly the caps: one request, one transaction, one audit row per node.
    done = cli("node", "block", *ids[:id_cap], "--reason", "r", env=cluster_env)
    assert done.code == 0, done.err
    assert done.out.startswith(f"{id_cap} nodes blocked: {ids[0]} {ids[1]} ")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE nodes SET labels = '{}' WHERE id = %s", (ids[-1],))
    done = cli("node", "unblock", "--selector", "fleet=big", env=cluster_env)
    assert done.code == 0 and done.out.startswith(f"{id_cap} nodes unblocked: ")
    done = cli("node", "block", "--selector", "fleet=big", "--reason", "r", env=cluster_env)
    assert done.code == 0 and done.out.startswith(f"{cap} nodes blocked: ")
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FILTER (WHERE state = 'blocked'),"
            " (SELECT count(*) FROM audit_log WHERE action = 'node.block'),"
            " (SELECT count(*) FROM audit_log WHERE action = 'node.unblock') FROM nodes"
        ).fetchone()
    assert row == (cap, id_cap + cap, id_cap)
