"""nodes.write_changes against the real PostgreSQL of the suite: single-node blocks and
unblocks that arrive together, written in a few statements, end exactly as the same
changes written one after another (`block`, `unblock`) would: the same refusals, the same
states and reasons, the same audit rows, the same notifications."""

from __future__ import annotations

import random
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from fixtures.cluster import ClusterFiles
from fixtures.cluster_db import node_id
from oz0 import audit, nodes
from oz0.store.events import NodeNews

ADA = audit.Actor("operator", "ada")
BOB = audit.Actor("operator", "bob")
STATES = ("pending", "accepted", "blocked", "rejected")


def seed(conn: psycopg.Connection[Any], states: dict[str, str]) -> None:
    """Nodes in the given states; the accepted and blocked ones have a certificate."""
    for nid, state in states.items():
        conn.execute(
            "INSERT INTO nodes (id, tenant, state, labels, certificate) VALUES (%s, 'default',"
            " %s, %s, %s)",
            (nid, state, Jsonb({}), "cert" if state in ("accepted", "blocked") else None),
        )


def outcome(result: tuple[nodes.Node | None, nodes.NodeError | None]) -> tuple[str, str]:
    node, error = result
    if error is not None:
        return type(error).__name__, str(error)
    assert node is not None
    return node.state, node.reason or ""


def one_by_one(
    conn: psycopg.Connection[Any], changes: list[nodes.NodeChange]
) -> list[tuple[str, str]]:
    results: list[tuple[str, str]] = []
    for change in changes:
        try:
            with conn.transaction():  # a savepoint: a refusal writes nothing
                results.append(outcome((change(conn), None)))
        except nodes.NodeError as e:
            results.append(outcome((None, e)))
    return results


def written(conn: psycopg.Connection[Any], since: int) -> tuple[list[Any], list[Any]]:
    """The nodes' states and reasons, and the audit rows after id SINCE (as sets of rows:
    changes that arrive together have no order among them)."""
    states = conn.execute("SELECT id, state, reason FROM nodes ORDER BY id").fetchall()
    rows = conn.execute(
        "SELECT actor_kind, actor, action, target, details::text FROM audit_log WHERE id > %s",
        (since,),
    ).fetchall()
    return states, sorted(rows)


def last_audit_id(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT coalesce(max(id), 0) FROM audit_log").fetchone()
    assert row is not None
    return int(row[0])


def both_ways(
    url: str, states: dict[str, str], changes: list[nodes.NodeChange]
) -> tuple[list[tuple[str, str]], list[tuple[str, str]], Any, Any]:
    """CHANGES written one by one and with write_changes, each from the same nodes (rolled
    back after): both ways' outcomes and what each wrote."""
    with psycopg.connect(url) as conn:
        seed(conn, states)
        conn.commit()
        since = last_audit_id(conn)
        with conn.transaction(force_rollback=True):
            alone = one_by_one(conn, changes)
            alone_wrote = written(conn, since)
        with conn.transaction(force_rollback=True):
            together = [outcome(r) for r in nodes.write_changes(conn, changes)]
            together_wrote = written(conn, since)
    return alone, together, alone_wrote, together_wrote


def test_refusals_and_changes_as_one_by_one(cluster_files: ClusterFiles) -> None:
    states = {node_id(i): s for i, s in enumerate(STATES * 2, start=1)}
    changes = [
        nodes.NodeChange("block", node_id(1), ADA, "pending, shut out"),
        nodes.NodeChange("block", node_id(2), BOB, "  accepted, shut out  "),
        nodes.NodeChange("block", node_id(3), ADA, "blocked already"),
        nodes.NodeChange("block", node_id(4), ADA, "rejected: refused"),
        nodes.NodeChange("block", node_id(99), ADA, "not a node"),
        nodes.NodeChange("block", "node-nonsense", ADA, "not an ID"),
        nodes.NodeChange("block", node_id(6), ADA, "   "),
        nodes.NodeChange("block", node_id(6), ADA, "two\nlines"),
        nodes.NodeChange("unblock", node_id(7), BOB),
        nodes.NodeChange("unblock", node_id(6), ADA),
        nodes.NodeChange("unblock", node_id(5), ADA),
    ]
    alone, together, alone_wrote, together_wrote = both_ways(cluster_files.main_db, states, changes)
    assert together == alone
    assert together_wrote == alone_wrote
    # What the one-by-one way says, spelled out for the reader.
    assert [kind for kind, _ in together] == [
        "blocked", "blocked", "NodeError", "NodeError", "NodeNotFound", "InvalidNodeId",
        "BadNodeInput", "BadNodeInput", "accepted", "NodeError", "NodeError",
    ]  # fmt: skip
    assert together[1] == ("blocked", "accepted, shut out")
    assert len(together_wrote[1]) == 3  # two blocks and an unblock audited


def test_random_batches_end_as_one_by_one(cluster_files: ClusterFiles) -> None:
    """A node named once per batch: its answer is its state after its own change (a node
    named twice answers both with its state at the end, and is left out here)."""
    rng = random.Random(13)
    url = cluster_files.main_db
    for round_ in range(6):
        ids = [node_id(1000 * round_ + i) for i in range(40)]
        states = {nid: rng.choice(STATES) for nid in ids}
        named = [*rng.sample(ids, 30), node_id(1000 * round_ + 999)]  # and one unknown
        changes = [
            nodes.NodeChange(
                rng.choice(("block", "unblock")), nid, rng.choice((ADA, BOB)), f"r{round_}"
            )
            for nid in named
        ]
        alone, together, alone_wrote, together_wrote = both_ways(url, states, changes)
        assert together == alone
        assert together_wrote == alone_wrote


def test_a_node_blocked_and_unblocked_in_one_batch_ends_unblocked(
    cluster_files: ClusterFiles,
) -> None:
    with psycopg.connect(cluster_files.main_db) as conn:
        seed(conn, {node_id(1): "accepted"})
        results = nodes.write_changes(
            conn,
            [
                nodes.NodeChange("block", node_id(1), ADA, "a moment"),
                nodes.NodeChange("unblock", node_id(1), BOB),
                nodes.NodeChange("unblock", node_id(1), BOB),
            ],
        )
        assert [outcome(r) for r in results] == [
            ("accepted", ""),
            ("accepted", ""),
            ("NodeError", f"node {node_id(1)} is accepted; only blocked nodes can be unblocked"),
        ]
        actions = conn.execute(
            "SELECT action FROM audit_log WHERE target = %s ORDER BY id", (f"node:{node_id(1)}",)
        ).fetchall()
        assert sorted(a for (a,) in actions) == ["node.block", "node.unblock"]


@pytest.mark.parametrize("count", [1, 50])
def test_each_blocked_node_is_notified_once(cluster_files: ClusterFiles, count: int) -> None:
    """The edges learn of each change from `oz0_nodes` (migration 0006's trigger)."""
    url = cluster_files.main_db
    ids = [node_id(i) for i in range(1, count + 1)]
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as conn:
        seed(conn, dict.fromkeys(ids, "accepted"))
        conn.commit()
        listener.execute("LISTEN oz0_nodes")
        nodes.write_changes(conn, [nodes.NodeChange("block", n, ADA, "quiet") for n in ids])
        conn.commit()
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=count)]
        rows = conn.execute("SELECT id, revision FROM nodes WHERE id = ANY(%s)", (ids,)).fetchall()
    assert len(heard) == count
    # Each says the node's new state and revision (migration 0013), for an edge to act on.
    news = {n.node_id: n for n in (NodeNews.parse(payload)[1] for payload in heard) if n}
    assert sorted(news) == ids
    assert {n.state for n in news.values()} == {"blocked"}
    assert {n.node_id: n.revision for n in news.values()} == dict(rows)


def test_a_key_and_a_deletion_are_news_with_the_revision_they_end(
    cluster_files: ClusterFiles,
) -> None:
    url = cluster_files.main_db
    nid = node_id(7)
    with psycopg.connect(url, autocommit=True) as listener, psycopg.connect(url) as conn:
        seed(conn, {nid: "pending"})
        conn.commit()
        listener.execute("LISTEN oz0_nodes")
        conn.execute(
            "UPDATE nodes SET public_key_sha256 = 'ab12', state = 'accepted' WHERE id = %s",
            (nid,),
        )
        conn.commit()
        row = conn.execute("SELECT revision FROM nodes WHERE id = %s", (nid,)).fetchone()
        assert row is not None
        (accepted_at,) = row
        nodes.delete(conn, nid, ADA)
        conn.commit()
        heard = [n.payload for n in listener.notifies(timeout=5, stop_after=2)]
    parsed = [NodeNews.parse(payload) for payload in heard]
    assert parsed == [
        (nid, NodeNews(nid, "accepted", "ab12", accepted_at)),
        (nid, NodeNews(nid, "deleted", "ab12", accepted_at)),
    ]
