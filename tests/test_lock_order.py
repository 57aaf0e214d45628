"""Writes that lock many nodes' rows take them in ID order, against the real PostgreSQL of
the suite: an edge's rounds of `seen` and `disconnected` and the API's batches of blocks
and unblocks, run against each other over nodes stored out of ID order, never deadlock."""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg
import psycopg.errors
from psycopg.types.json import Jsonb

from fixtures.cluster import ClusterFiles
from fixtures.cluster_db import node_id
from oz0 import audit, nodes

NODES = 300
SECONDS = 4.0
ADA = audit.Actor("operator", "ada")


def test_an_edge_s_rounds_and_batches_of_blocks_do_not_deadlock(
    cluster_files: ClusterFiles,
) -> None:
    url = cluster_files.main_db
    ids = [node_id(i) for i in range(1, NODES + 1)]
    stored = random.Random(5).sample(ids, len(ids))  # a scan meets them out of ID order
    with psycopg.connect(url) as conn:
        for nid in stored:
            conn.execute(
                "INSERT INTO nodes (id, tenant, state, labels, certificate)"
                " VALUES (%s, 'default', 'accepted', %s, 'cert')",
                (nid, Jsonb({})),
            )
    deadlocks: list[str] = []
    rounds = [0, 0]
    until = time.monotonic() + SECONDS

    def keep_writing(who: int, write: Any) -> None:
        rng = random.Random(who)
        with psycopg.connect(url) as conn:
            while time.monotonic() < until:
                try:
                    with conn.transaction():
                        write(conn, rng)
                    rounds[who] += 1
                except psycopg.errors.DeadlockDetected as e:
                    deadlocks.append(f"{who}: {e}")

    def edge(conn: psycopg.Connection[Any], rng: random.Random) -> None:
        nodes.streams_recorded(conn, rng.sample(stored, 200), rng.sample(stored, 50), "server-1")

    def api(conn: psycopg.Connection[Any], rng: random.Random) -> None:
        action = rng.choice(("block", "unblock"))
        chosen = rng.sample(stored, 60)
        nodes.write_changes(conn, [nodes.NodeChange(action, n, ADA, "test") for n in chosen])

    threads = [
        threading.Thread(target=keep_writing, args=(0, edge)),
        threading.Thread(target=keep_writing, args=(1, api)),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(SECONDS + 30)
    assert deadlocks == []
    assert min(rounds) > 10, rounds  # they did run against each other
