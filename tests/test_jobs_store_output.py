"""The jobs' rows on a real PostgreSQL: an attempt's output stored once, capped, from its
own node only, read by followers while parts write, and paged.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them
(fixtures/job_rows.py).
"""

from __future__ import annotations

import random
import threading
import time
from typing import Any

import psycopg

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import add_node, new_job, place
from oz0.jobs import store
from oz0.jobs.end_reasons import EndReason
from oz0.web import job_pages

CLEAN = job_rows.CLEAN


def test_output_is_stored_once_capped_and_only_from_the_attempts_node(
    conn: psycopg.Connection[Any],
) -> None:
    node, stranger = add_node(conn), add_node(conn)
    job = new_job(conn, node=node)
    assert place(conn, job, 1).node == node

    def append(seq: int, data: bytes, who: str = node) -> bool:
        with conn.transaction():
            return store.append_output(conn, who, job.id, 1, seq, "stdout", data, False)

    assert append(0, b"hello ")
    assert append(0, b"hello ")  # sent again after a lost ack: stored once
    assert not append(1, b"not mine", who=stranger)
    assert append(1, b"x" * (store.OUTPUT_CAP - 3))
    assert append(2, b"overflowing")  # past the mark: acknowledged, not kept
    chunks = store.output_page(conn, job.id).chunks
    assert [c.data[:6] for c in chunks] == [b"hello ", b"xxxxxx"]
    assert sum(len(c.data) for c in chunks) == store.OUTPUT_CAP
    assert chunks[-1].truncated and store.get(conn, job.id).attempts[0].truncated
    after_first = store.output_page(conn, job.id, after=chunks[0].cursor).chunks
    assert [c.cursor for c in after_first] == [c.cursor for c in chunks[1:]]
    with conn.transaction():
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
    assert not append(3, b"late")  # the attempt has ended: nothing more is kept


def test_a_follower_reading_while_many_parts_write_at_once_misses_no_chunk(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    # An `--all` job's parts write their output at once, each in its own transaction, as
    # each node's edge stores it; a follower (`job run`, `job logs --follow`, the web UI's
    # live page) reads pages after its cursor meanwhile. Each writer is held up a little
    # between its insert and its commit (as a busy server is), so that commits come out of
    # the rows' order unless the store keeps them in it.
    parts, chunks = 8, 25
    job = new_job(conn, all=True)
    nodes_ = [add_node(conn) for _ in range(parts)]
    for number, node in enumerate(nodes_, start=1):
        conn.execute(
            "INSERT INTO job_attempts (job_id, number, part, node_id) VALUES (%s, %s, %s, %s)",
            (job.id, number, number, node),
        )
    start, writing = threading.Barrier(parts + 1), threading.Event()
    failures: list[BaseException] = []

    def write(number: int, node: str) -> None:
        jitter = random.Random(number)
        try:
            with psycopg.connect(one_cluster.main_db, autocommit=True) as mine:
                start.wait(timeout=10)
                for seq in range(chunks):
                    with mine.transaction():
                        data = f"part {number} chunk {seq}\n".encode()
                        assert store.append_output(mine, node, job.id, number, seq, "stdout",
                                                   data, False)  # fmt: skip
                        time.sleep(jitter.uniform(0, 0.004))
        except BaseException as e:  # reported below, not lost in the thread
            failures.append(e)

    writers = [
        threading.Thread(target=write, args=(n, node)) for n, node in enumerate(nodes_, start=1)
    ]
    for t in writers:
        t.start()
    followed: list[int] = []
    with psycopg.connect(one_cluster.main_db, autocommit=True) as reader:
        start.wait(timeout=10)
        cursor = 0
        while any(t.is_alive() for t in writers) or not writing.is_set():
            if not any(t.is_alive() for t in writers):
                writing.set()  # one more read after the last commit
            page = store.output_page(reader, job.id, after=cursor)
            followed += [c.cursor for c in page.chunks]
            cursor = page.cursor or cursor
    for t in writers:
        t.join(timeout=30)
    assert not failures, failures
    stored = [r[0] for r in conn.execute(
        "SELECT id FROM job_output WHERE job_id = %s ORDER BY id", (job.id,)
    )]  # fmt: skip
    assert len(stored) == parts * chunks
    assert followed == stored, f"the follower missed {len(set(stored) - set(followed))} chunks"


def test_a_hostile_node_past_the_cap_adds_one_mark_and_every_chunk_is_acknowledged(
    conn: psycopg.Connection[Any],
) -> None:
    node = add_node(conn)
    job = new_job(conn, node=node)
    assert place(conn, job, 1).node == node

    def append(seq: int, data: bytes, truncated: bool = False) -> bool:
        return store.append_output(conn, node, job.id, 1, seq, "stdout", data, truncated)

    def rows() -> int:
        row = conn.execute("SELECT count(*) FROM job_output WHERE job_id = %s", (job.id,))
        return int(row.fetchone()[0])  # type: ignore[index]

    # Empty chunks that mark nothing store nothing, before the cap as after it.
    assert all(append(seq, b"") for seq in range(100))
    assert rows() == 0
    whole = store.OUTPUT_CAP // store.MAX_CHUNK
    assert all(append(100 + i, b"x" * store.MAX_CHUNK) for i in range(whole))
    assert rows() == whole
    # 10,000 chunks past the cap, each a new seq, some claiming to be the mark: the first
    # is the attempt's one truncation mark, the rest are acknowledged and add nothing.
    # One transaction for all of them (the edge makes one per chunk): the same statements,
    # without 10,000 commits to flush.
    with conn.transaction():
        past = [
            append(100 + whole + i, b"y" * (i % 7), truncated=i % 3 == 0) for i in range(10_000)
        ]
    assert all(past)
    assert rows() == whole + 1
    attempt = store.get(conn, job.id).attempts[0]
    assert attempt.truncated and attempt.output_bytes == store.OUTPUT_CAP
    *_, mark = store.output_page(conn, job.id, limit=1000).chunks
    assert mark.truncated and mark.data == b""


def test_a_page_of_output_is_bounded_by_chunks_and_by_bytes(
    conn: psycopg.Connection[Any],
) -> None:
    node = add_node(conn)
    tiny, big = new_job(conn, node=node), new_job(conn, node=node)
    assert place(conn, tiny, 1).node == node and place(conn, big, 1).node == node
    # What a node could send before the cap: 20,000 one-byte chunks; and 32 whole ones.
    for job, count, size in ((tiny, 20_000, 1), (big, 32, store.MAX_CHUNK)):
        conn.execute(
            "INSERT INTO job_output (job_id, attempt, seq, stream, data)"
            " SELECT %s, 1, seq, 'stdout', repeat('z', %s)::bytea"
            " FROM generate_series(0, %s - 1) AS seq",
            (job.id, size, count),
        )

    page = store.output_page(conn, tiny.id)
    assert (len(page.chunks), page.more) == (store.PAGE_CHUNKS, True)
    page = store.output_page(conn, tiny.id, limit=10**6)
    assert (len(page.chunks), page.more) == (store.MAX_PAGE_CHUNKS, True)
    page = store.output_page(conn, big.id, limit=1000, max_bytes=3 * store.MAX_CHUNK + 1)
    assert [len(c.data) for c in page.chunks] == [store.MAX_CHUNK] * 3 and page.more
    # One chunk always, however small the byte bound, so that a reader moves on.
    assert len(store.output_page(conn, big.id, max_bytes=1).chunks) == 1
    page = store.output_page(conn, big.id, limit=1000)
    assert sum(len(c.data) for c in page.chunks) <= store.PAGE_BYTES
    last = store.output_page(conn, big.id, after=page.chunks[-1].cursor)
    assert (len(page.chunks) + len(last.chunks), last.more) == (32, False)

    # The web UI's job page reads at most SHOWN_CHUNKS, and says it cut the rest.
    shown, _, cut = job_pages.output_of(conn, store.get(conn, tiny.id))
    assert sum(len(p.data) for p in shown[0].pieces) == job_pages.SHOWN_CHUNKS and cut
    shown, _, cut = job_pages.output_of(conn, store.get(conn, big.id))
    assert sum(len(p.data) for p in shown[0].pieces) == store.OUTPUT_CAP and not cut
