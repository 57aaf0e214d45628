"""Stored files on a real PostgreSQL (oz0/file_blobs.py): uploaded in chunks and complete
only once their SHA-256 is checked, within the tenant's caps; served to a node only for a
running part of its own that names them; removed by the retention pruner once nothing
names them. No server runs here: nodes and jobs are rows (fixtures/job_rows.py)."""

from __future__ import annotations

import hashlib
import os
from typing import Any

import psycopg
import pytest

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import ADMIN, add_node, ended_ago, new_job, place, prune
from oz0 import file_blobs, tenants
from oz0.file_blob_cache import BlobCache
from oz0.jobs import store
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.spec import JobError, JobSpec
from oz0_common.file_push import CHUNK, CHUNKS_PER_UPLOAD, SERVED_MOST, PushOrder

CLEAN = (
    *job_rows.CLEAN,
    "TRUNCATE file_blobs CASCADE",
    "UPDATE tenants SET max_file_bytes = DEFAULT, max_files_bytes = DEFAULT",
)


def upload(conn: psycopg.Connection[Any], content: bytes, tenant: str = "default") -> str:
    sha256 = hashlib.sha256(content).hexdigest()
    with conn.transaction():
        missing = file_blobs.register(conn, tenant, sha256, len(content), "f", ADMIN)
    for seq in missing:
        with conn.transaction():
            file_blobs.put_chunk(
                conn, tenant, sha256, seq, content[seq * CHUNK : (seq + 1) * CHUNK]
            )
    return sha256


def test_a_file_is_complete_only_once_every_chunk_is_in_and_hashes_to_its_name(
    conn: psycopg.Connection[Any],
) -> None:
    content = os.urandom(2 * CHUNK + 5)
    sha256 = hashlib.sha256(content).hexdigest()
    with conn.transaction():
        assert file_blobs.register(conn, "default", sha256, len(content), "a", ADMIN) == [0, 1, 2]
    with conn.transaction():
        assert not file_blobs.put_chunk(conn, "default", sha256, 2, content[2 * CHUNK :])
    with conn.transaction():
        assert file_blobs.register(conn, "default", sha256, len(content), "a", ADMIN) == [0, 1]
    with pytest.raises(JobError, match="has no complete file"), conn.transaction():
        store.create(conn, _push_spec(sha256, len(content)), ADMIN)
    # A changed byte: refused once the last chunk is in, every chunk dropped.
    with conn.transaction():
        file_blobs.put_chunk(conn, "default", sha256, 0, content[:CHUNK])
    with conn.transaction():
        wrong = file_blobs.put_chunk(conn, "default", sha256, 1, b"x" * CHUNK)
    assert isinstance(wrong, file_blobs.Mismatch) and "hash to" in str(wrong.error())
    with conn.transaction():
        assert file_blobs.register(conn, "default", sha256, len(content), "a", ADMIN) == [0, 1, 2]
    assert upload(conn, content) == sha256
    with conn.transaction():
        assert file_blobs.register(conn, "default", sha256, len(content), "a", ADMIN) == []
        store.create(conn, _push_spec(sha256, len(content)), ADMIN)


def test_one_upload_carries_several_whole_rows_and_nothing_else(
    conn: psycopg.Connection[Any],
) -> None:
    content = os.urandom((CHUNKS_PER_UPLOAD + 3) * CHUNK + 7)
    sha256 = hashlib.sha256(content).hexdigest()
    with conn.transaction():
        assert len(file_blobs.register(conn, "default", sha256, len(content), "m", ADMIN)) == (
            CHUNKS_PER_UPLOAD + 4
        )
    for seq, data in (
        (0, content[: CHUNK + 1]),  # not whole rows
        (0, content[: (CHUNKS_PER_UPLOAD + 1) * CHUNK]),  # more rows than a request takes
        (CHUNKS_PER_UPLOAD, content[CHUNKS_PER_UPLOAD * CHUNK :] + b"x"),  # past the end
        (1, b""),
    ):
        with pytest.raises(file_blobs.FileError, match="whole rows"), conn.transaction():
            file_blobs.put_chunk(conn, "default", sha256, seq, data)
    with conn.transaction():
        assert not file_blobs.put_chunk(
            conn, "default", sha256, 0, content[: CHUNKS_PER_UPLOAD * CHUNK]
        )
    with conn.transaction():
        missing = file_blobs.register(conn, "default", sha256, len(content), "m", ADMIN)
    assert missing == [CHUNKS_PER_UPLOAD + i for i in range(4)]
    with conn.transaction():  # the rest, the file's short last row with it
        done = file_blobs.put_chunk(
            conn, "default", sha256, CHUNKS_PER_UPLOAD, content[CHUNKS_PER_UPLOAD * CHUNK :]
        )
    assert done is True


def test_a_tenants_caps_on_one_file_and_on_all_of_them(conn: psycopg.Connection[Any]) -> None:
    # Set as `tenant set --max-file-size 100 --max-files-size 150` sets them.
    with conn.transaction():
        tenants.change(
            conn, "default", tenants.Settings(max_file_bytes=100, max_files_bytes=150), ADMIN
        )
    upload(conn, b"a" * 100)
    big = pytest.raises(file_blobs.FileError, match="cap of 100 a file")
    with big as one, conn.transaction():
        file_blobs.register(conn, "default", "0" * 64, 101, "big", ADMIN)
    assert one.value.status == 413
    more = pytest.raises(file_blobs.FileError, match="past its cap of 150")
    with more as total, conn.transaction():
        file_blobs.register(conn, "default", "1" * 64, 51, "more", ADMIN)
    assert total.value.status == 429
    upload(conn, b"b" * 50)


def _push_spec(sha256: str, size: int, **fields: Any) -> JobSpec:
    order = PushOrder(sha256, size, "x.conf")
    return JobSpec.from_json({"command": order.command(), **fields})


def test_a_node_is_served_only_what_a_running_part_of_its_own_names(
    conn: psycopg.Connection[Any],
) -> None:
    content = os.urandom(CHUNK + 10)
    sha256 = upload(conn, content)
    other = upload(conn, b"not pushed")
    node, stranger = add_node(conn), add_node(conn)
    job = new_job(conn, command=PushOrder(sha256, len(content), "x").command(), node=node)
    assert place(conn, job, 1).node == node

    def read(who: str, sha: str, offset: int) -> tuple[bytes, int] | None:
        with conn.transaction():
            return file_blobs.read_for_node(conn, who, job.id, 1, sha, offset, CHUNK)

    assert read(node, sha256, 0) == (content[:CHUNK], len(content))
    assert read(node, sha256, CHUNK) == (content[CHUNK:], len(content))
    assert read(node, sha256, len(content)) == (b"", len(content))
    assert read(stranger, sha256, 0) is None
    assert read(node, other, 0) is None
    with conn.transaction():
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
    assert read(node, sha256, 0) is None, "an ended part is served nothing"
    # `job run --file`: its files are served to its parts too.
    placed = new_job(conn, node=node, files=[{"sha256": other, "size": 10, "name": "in"}])
    assert place(conn, placed, 1).node == node
    with conn.transaction():
        assert file_blobs.read_for_node(conn, node, placed.id, 1, other, 0, CHUNK) == (
            b"not pushed", 10,
        )  # fmt: skip


def test_a_piece_spans_rows_and_a_server_reads_a_blob_once_for_many_nodes(
    conn: psycopg.Connection[Any],
) -> None:
    content = os.urandom(40 * CHUNK + 123)  # two spans of the cache, the last one short
    sha256 = upload(conn, content)
    nodes = [add_node(conn) for _ in range(3)]
    order = PushOrder(sha256, len(content), "x").command()
    jobs = []
    for node in nodes:
        job = new_job(conn, command=order, node=node)
        assert place(conn, job, 1).node == node
        jobs.append(job)
    cache = BlobCache(max_bytes=64 * CHUNK, span_rows=32)

    def read(i: int, offset: int, most: int, cached: bool = True) -> tuple[bytes, int] | None:
        with conn.transaction():
            return file_blobs.read_for_node(
                conn, nodes[i], jobs[i].id, 1, sha256, offset, most, cache if cached else None
            )

    size = len(content)
    for offset, most in ((0, SERVED_MOST), (CHUNK - 5, SERVED_MOST), (31 * CHUNK, 3 * CHUNK),
                         (size - 200, SERVED_MOST), (7, 1)):  # fmt: skip
        want = (content[offset : offset + most], size)
        assert read(0, offset, most) == want and read(0, offset, most, cached=False) == want
    assert cache.reads == 2, "each span read once from the database"
    whole = b""
    for i in (1, 2):  # the other nodes' pushes: from what the server kept
        got = b""
        while len(got) < size:
            piece = read(i, len(got), SERVED_MOST)
            assert piece is not None
            got += piece[0]
        whole = got
    assert whole == content and cache.reads == 2
    assert cache.kept_bytes == size
    # Kept or not, a node is served only what a running part of its own names.
    with conn.transaction():
        assert file_blobs.read_for_node(
            conn, nodes[0], jobs[1].id, 1, sha256, 0, SERVED_MOST, cache
        ) is None  # fmt: skip
    # Past MAX_BYTES the least recently used span goes.
    small = BlobCache(max_bytes=40 * CHUNK, span_rows=32)
    with conn.transaction():
        file_blobs.read_for_node(conn, nodes[0], jobs[0].id, 1, sha256, 0, CHUNK, small)
        file_blobs.read_for_node(conn, nodes[0], jobs[0].id, 1, sha256, size - 1, 1, small)
    assert small.kept_bytes == size - 32 * CHUNK, "the first span gave way to the second"


def test_the_pruner_removes_files_nothing_names_and_keeps_the_others(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    node = add_node(conn)
    pushed, deleted, kept = (upload(conn, c) for c in (b"pushed", b"deleted", b"kept"))
    job = new_job(conn, command=PushOrder(pushed, 6, "x").command(), node=node)
    assert place(conn, job, 1).node == node
    conn.execute("UPDATE tenant_files SET used_at = now() - interval '31 days'")
    with conn.transaction():
        file_blobs.delete(conn, "default", deleted, ADMIN)
    conn.execute("UPDATE tenant_files SET used_at = now() WHERE sha256 = %s", (kept,))
    assert prune(one_cluster).files == 1, "only the deleted one: a running job names pushed"
    assert _blobs(conn) == {pushed, kept}
    with conn.transaction():
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
        store.finish(conn, job.id, "succeeded", 0, None)
    ended_ago(conn, job, 31)
    done = prune(one_cluster)
    assert (done.jobs, done.files) == (1, 1)
    assert _blobs(conn) == {kept}
    assert conn.execute("SELECT count(*) FROM file_chunks").fetchone() == (1,)


def _blobs(conn: psycopg.Connection[Any]) -> set[str]:
    return {r[0] for r in conn.execute("SELECT sha256 FROM file_blobs")}
