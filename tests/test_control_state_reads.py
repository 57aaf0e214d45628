"""nodes.control_states against the real PostgreSQL of the suite: the re-reads of streams
whose nodes changed together, answered in one statement exactly as `control_state` answers
each (a key that is not the node's own reads as no node), and shared through the edge's
Batches as its control streams use them (`Edge.state_reads`)."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
from cryptography.hazmat.primitives.asymmetric import ec
from psycopg.types.json import Jsonb

from fixtures.cluster import ClusterFiles
from oz0 import nodes
from oz0.server.edge.common import state_reads
from oz0.store.pool import open_database


def seed(url: str, count: int) -> list[tuple[str, ec.EllipticCurvePublicKey]]:
    """COUNT accepted nodes, every third blocked: their IDs and keys."""
    made = []
    with psycopg.connect(url) as conn:
        conn.execute("INSERT INTO tenants (name) VALUES ('tenant-0'), ('tenant-1')")
        for i in range(count):
            node_id, key = f"node-{i:012x}", ec.generate_private_key(ec.SECP256R1()).public_key()
            conn.execute(
                "INSERT INTO nodes (id, tenant, state, labels, certificate, public_key_sha256)"
                " VALUES (%s, %s, %s, %s, 'cert', %s)",
                (
                    node_id,
                    f"tenant-{i % 2}",
                    "blocked" if i % 3 == 0 else "accepted",
                    Jsonb({}),
                    nodes.public_key_sha256(key),
                ),
            )
            made.append((node_id, key))
    return made


def test_many_read_in_one_statement_as_each_alone(cluster_files: ClusterFiles) -> None:
    url = cluster_files.main_db
    made = seed(url, 9)
    stranger = ec.generate_private_key(ec.SECP256R1()).public_key()
    reads = [
        *(nodes.ControlStateRead(node_id, key) for node_id, key in made),
        nodes.ControlStateRead(made[1][0], stranger),  # a certificate of another key
        nodes.ControlStateRead("node-0000000000ff", made[2][1]),  # no such node
        nodes.ControlStateRead(made[4][0], made[4][1]),  # read twice
    ]
    with psycopg.connect(url) as conn:
        together = nodes.control_states(conn, reads)
        alone = [read(conn) for read in reads]
    assert [answer for answer, _ in together] == alone
    assert [failed for _, failed in together] == [None] * len(reads)
    first, second = alone[0], alone[1]
    assert first is not None and (first.state, first.tenant) == ("blocked", "tenant-0")
    assert second is not None and (second.state, second.tenant) == ("accepted", "tenant-1")
    assert first.revision < second.revision  # seeded one after the other
    assert alone[-3:-1] == [None, None]


async def test_streams_that_wake_together_share_one_read(
    cluster_files: ClusterFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = cluster_files.main_db
    made = seed(url, 40)
    async with open_database(url, min_size=1, max_size=2) as db:
        transactions = 0
        real = db.transaction

        async def counted(work: Any) -> Any:
            nonlocal transactions
            transactions += 1
            return await real(work)

        monkeypatch.setattr(db, "transaction", counted)
        reads = state_reads(db)
        answers: dict[str, nodes.ControlState | None] = {}

        async def stream(node_id: str, key: ec.EllipticCurvePublicKey) -> None:
            answers[node_id] = await reads.run(nodes.ControlStateRead(node_id, key))

        async with trio.open_nursery() as nursery:
            await nursery.start(reads.serve)
            with trio.fail_after(10):
                async with trio.open_nursery() as streams:
                    for node_id, key in made:
                        streams.start_soon(stream, node_id, key)
            nursery.cancel_scope.cancel()
    assert transactions == 1
    with psycopg.connect(url) as conn:
        assert answers == {
            node_id: nodes.control_state(conn, node_id, key) for node_id, key in made
        }
    assert sum(1 for a in answers.values() if a is not None and a.state == "blocked") == 14
