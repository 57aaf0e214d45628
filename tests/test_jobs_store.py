"""The jobs' rows on a real PostgreSQL: what `job run` accepts, placement, moves, output.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them.
"""

from __future__ import annotations

import asyncio
import random
import secrets
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import psycopg
import pytest
import trio

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import ADMIN, OneConnection, add_node, new_job, place
from oz0 import audit, nodes, pki, tenants
from oz0.jobs import inputs, placement, pruner, secret_env, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.role import claim_for_start
from oz0.jobs.spec import JobEnded, JobError, JobSpec, TooManyQueued
from oz0.jobs.workflow import AttemptEnd, Finish, Placed
from oz0.store.pool import open_database
from oz0.web import job_pages
from oz0_common import certs, sealed_env

T = TypeVar("T")
CLEAN = job_rows.CLEAN


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "command must be a non-empty list"),
        ({"command": []}, "command must be a non-empty list"),
        ({"command": ["ls", 3]}, "every argument of the command must be text"),
        ({"command": ["a\0b"]}, "NUL"),
        ({"command": ["true"], "timeout": 0}, "timeout must be more than 0"),
        ({"command": ["true"], "timeout": True}, "timeout must be a number"),
        ({"command": ["true"], "retries": -1}, "retries must be a whole number"),
        ({"command": ["true"], "env": {"OZ0_JOB_ID": "x"}}, "are the agent's"),
        ({"command": ["true"], "env": {"1BAD": "x"}}, "invalid environment variable name"),
        ({"command": ["true"], "selector": {"Bad Key": "x"}}, "selector: invalid label key"),
        ({"command": ["true"], "node": "nope"}, "invalid node ID"),
        ({"command": ["true"], "all": True, "node": "node-0123456789ab"}, "either a node or all"),
        ({"command": ["true"], "colour": "red"}, "unknown field 'colour'"),
        ({"command": ["true"], "limits": []}, "limits must be an object"),
        ({"command": ["true"], "limits": {"disk": 1}}, "unknown limit 'disk'"),
        ({"command": ["true"], "limits": {"memory": "lots"}}, "limits.memory: invalid size"),
        ({"command": ["true"], "limits": {"memory": 1024}}, "at least 4 MiB"),
        ({"command": ["true"], "limits": {"memory": True}}, "limits.memory: invalid size"),
        ({"command": ["true"], "limits": {"address_space": "3M"}}, "at least 4 MiB"),
        ({"command": ["true"], "limits": {"cpu": 0}}, "limits.cpu: invalid cpu 0"),
        ({"command": ["true"], "limits": {"cpu": "half"}}, "limits.cpu: invalid cpu"),
        ({"command": ["true"], "limits": {"cpu": 2000}}, "from 0.01 to 1024"),
        ({"command": ["true"], "limits": {"max_processes": 0}}, "from 1 to"),
        ({"command": ["true"], "limits": {"max_processes": 1.5}}, "from 1 to"),
        ({"command": ["true"], "limits": {"max_open_files": 15}}, "from 16 to"),
    ],
)
def test_a_job_asked_for_wrongly_is_refused_with_the_reason(
    body: dict[str, Any], message: str
) -> None:
    with pytest.raises(JobError, match=message):
        JobSpec.from_json(body)


def test_a_new_job_is_queued_audited_and_shows_env_names_only(
    conn: psycopg.Connection[Any],
) -> None:
    job = new_job(conn, command=["env"], env={"TOKEN": "s3cret"}, selector={"role": "web"})
    shown = job.to_json()
    assert shown["state"] == "queued" and shown["attempts"] == []
    assert shown["env"] == ["TOKEN"] and "s3cret" not in str(shown)
    row = conn.execute(
        "SELECT actor, action, details FROM audit_log WHERE target = %s", (f"job:{job.id}",)
    ).fetchone()
    assert row is not None and row[0] == "admin" and row[1] == "job.run"
    assert "s3cret" not in str(row[2]) and row[2]["selector"] == {"role": "web"}


def test_bad_limits_are_one_line_and_write_nothing(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(JobError) as caught:
        new_job(conn, limits={"memory": "2G", "max_open_files": 8})
    assert str(caught.value) == (
        "limits.max_open_files: max open files must be a whole number from 16 to 1048576, not 8"
    )
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM audit_log").fetchone() == (0,)


def test_limits_are_kept_with_the_job_and_what_a_node_applied_with_its_attempt(
    conn: psycopg.Connection[Any],
) -> None:
    node = add_node(conn)
    job = new_job(conn, node=node, limits={"memory": "512M", "cpu": 0.5, "max_processes": 64})
    asked = {"memory": 512 << 20, "cpu": 0.5, "max_processes": 64}
    assert job.limits == asked and job.to_json()["limits"] == asked
    assert new_job(conn).limits == {} and new_job(conn, limits=None).limits == {}
    row = conn.execute(
        "SELECT details FROM audit_log WHERE target = %s", (f"job:{job.id}",)
    ).fetchone()
    assert row is not None and row[0]["limits"] == asked
    applied = {
        "user": "uid 61184 (its own)",
        "tracking": "cgroup v2",
        "limits": {"memory": "cgroup v1"},
        "private_tmp": "mount namespace",
        "swept": "ended 1 process, removed 2 files",
    }
    # A node is not trusted to keep to the shape: unknown keys go, text is cut and made
    # printable.
    hostile = {
        "user": "x\x1b[2J" + "y" * 500,
        "limits": {"memory": 7, "cpu": "rlimit", "disk": "z"},
        "extra": "dropped",
    }
    # The third: an older node that said nothing, or an attempt that ended without an answer.
    for number, said in ((1, applied), (2, hostile), (3, None)):
        assert place(conn, job, number).node == node
        with conn.transaction():
            store.end_attempt(conn, job.id, number, EndReason.EXIT, 1, said)
    first, second, third = store.get(conn, job.id).attempts
    assert first.applied == applied and first.to_json()["applied"] == applied
    assert second.applied == {"user": "x?[2J" + "y" * 195, "limits": {"cpu": "rlimit"}}
    assert third.applied is None and third.to_json()["applied"] is None


def test_unknown_tenant_or_foreign_node_makes_no_job(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(store.TenantNotFound):
        new_job(conn, tenant="nowhere")
    conn.execute("INSERT INTO tenants (name) VALUES ('acme')")
    other = add_node(conn, tenant="acme")
    with pytest.raises(JobError, match=f"node {other} is not a node of tenant default"):
        new_job(conn, node=other)
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (0,)


def test_placement_matches_tenant_selector_and_connection_least_busy_first(
    conn: psycopg.Connection[Any],
) -> None:
    conn.execute("INSERT INTO tenants (name) VALUES ('acme')")
    add_node(conn, tenant="acme", labels={"role": "web"})
    add_node(conn, labels={"role": "db"})
    add_node(conn, labels={"role": "web"}, connected=False)
    add_node(conn, labels={"role": "web"}, state="blocked")
    web_a = add_node(conn, labels={"role": "web", "zone": "a"})
    web_b = add_node(conn, labels={"role": "web", "zone": "b"})

    first = place(conn, new_job(conn, selector={"role": "web"}), 1)
    assert first.node in (web_a, web_b)
    busier = first.node
    for _ in range(2):
        assert place(conn, new_job(conn, node=busier), 1).node == busier
    # The other one is less busy now, until it is as busy.
    for _ in range(3):
        assert place(conn, new_job(conn, selector={"role": "web"}), 1).node != busier
    assert place(conn, new_job(conn, selector={"zone": "b"}), 1).node == web_b


def test_tried_nodes_come_last_and_a_retried_placement_answers_the_same(
    conn: psycopg.Connection[Any],
) -> None:
    a, b = add_node(conn), add_node(conn)
    for _ in range(3):  # b is busier: only having tried a can send the job there
        place(conn, new_job(conn, node=b), 1)
    job = new_job(conn)
    first = place(conn, job, 1)
    assert first.node == a
    assert place(conn, job, 1) == first  # the step run again after a lost answer
    with conn.transaction():
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 1)
    assert place(conn, job, 2, tried=[a]).node == b
    assert [x.node for x in store.get(conn, job.id).attempts] == [a, b]


@pytest.mark.parametrize(
    ("setup", "fields", "reason"),
    [
        ("none", {}, "tenant default has no accepted node"),
        ("none", {"selector": {"role": "gpu"}},
         "no accepted node of tenant default matches role=gpu"),
        ("offline", {}, "the one accepted node of tenant default is not connected"),
        ("two offline", {"selector": {"role": "web"}},
         "none of the 2 accepted nodes of tenant default matching role=web is connected"),
    ],
)  # fmt: skip
def test_a_job_no_node_can_take_stays_queued_saying_why(
    conn: psycopg.Connection[Any], setup: str, fields: dict[str, Any], reason: str
) -> None:
    if setup == "offline":
        add_node(conn, connected=False)
    if setup == "two offline":
        add_node(conn, connected=False, labels={"role": "web"})
        add_node(conn, connected=False, labels={"role": "web"})
    job = new_job(conn, **fields)
    placed = place(conn, job, 1)
    assert placed.node is None and placed.reason == reason
    shown = store.get(conn, job.id)
    assert shown.state == "queued" and shown.reason == reason


def test_a_running_attempt_on_a_blocked_or_deleted_node_is_found_to_move(
    conn: psycopg.Connection[Any],
) -> None:
    blocked, deleted, purged, fine = (add_node(conn) for _ in range(4))
    jobs = {}
    for node in (blocked, deleted, purged, fine):
        job = new_job(conn, node=node)
        assert place(conn, job, 1).node == node
        jobs[node] = job.id
    conn.execute("UPDATE nodes SET state = 'blocked' WHERE id = %s", (blocked,))
    conn.execute("DELETE FROM nodes WHERE id = %s", (deleted,))
    # A purge answered (and the node forgotten) before any server saw it `purging`.
    conn.execute("DELETE FROM nodes WHERE id = %s", (purged,))
    audit.record(conn, audit.Actor("node", purged), "node.purged", f"node:{purged}")
    assert {(r.job_id, r.because) for r in store.removed_attempts(conn)} == {
        (jobs[blocked], "node blocked"),
        (jobs[deleted], "node deleted"),
        (jobs[purged], "node purged"),
    }
    store.removal_signalled(conn, jobs[blocked], 1)
    assert {r.job_id for r in store.removed_attempts(conn)} == {jobs[deleted], jobs[purged]}
    # The attempt's end takes the node's word when the workflow has none of its own.
    with conn.transaction():
        assert store.end_attempt(conn, jobs[blocked], 1, None, None) == "node blocked"
        assert store.end_attempt(conn, jobs[blocked], 1, EndReason.EXIT, 0) == "node blocked"
        assert store.end_attempt(conn, jobs[purged], 1, None, None) == "node purged"


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


def test_cancel_before_any_workflow_ends_the_job_at_once_and_once(
    conn: psycopg.Connection[Any],
) -> None:
    job = new_job(conn)
    with conn.transaction():
        cancelled = store.request_cancel(conn, job.id, ADMIN)
    assert cancelled.state == "cancelled" and cancelled.ended_at is not None
    with pytest.raises(JobEnded), conn.transaction():
        store.request_cancel(conn, job.id, ADMIN)
    with conn.transaction():
        assert store.claim_unstarted(conn) == []  # nothing left to start
    started = new_job(conn)
    with conn.transaction():
        assert [j.id for j in store.claim_unstarted(conn)] == [started.id]
        assert store.claim_unstarted(conn) == []  # claimed: no other server takes it
        store.started(conn, started.id)
    with conn.transaction():
        asked = store.request_cancel(conn, started.id, ADMIN)
    assert asked.state == "queued"  # its workflow is told, and ends it
    assert store.to_cancel(conn) == [(started.id, "default")]
    actions = conn.execute("SELECT count(*) FROM audit_log WHERE action = 'job.cancel'").fetchone()
    assert actions == (2,)


def test_a_node_with_every_slot_taken_gets_no_more_attempts(
    conn: psycopg.Connection[Any],
) -> None:
    node = add_node(conn)
    for _ in range(placement.NODE_SLOTS):
        assert place(conn, new_job(conn), 1).node == node
    full = new_job(conn)
    placed = place(conn, full, 1)
    assert placed.node is None
    assert (
        placed.reason
        == f"the one connected node is busy: it runs {placement.NODE_SLOTS} attempts, its most"
    )
    with conn.transaction():
        store.end_attempt(conn, store.list_jobs(conn)[-1].id, 1, EndReason.EXIT, 0)
    assert place(conn, full, 1).node == node  # a slot is free again


def test_a_node_takes_as_many_attempts_as_its_agent_says_it_runs(
    conn: psycopg.Connection[Any],
) -> None:
    """`oz0-node start --max-jobs 6`: its edge records 6, and placement goes by it."""
    node = add_node(conn)
    with conn.transaction():
        nodes.set_max_jobs(conn, node, 6)
    running = [new_job(conn) for _ in range(6)]
    for job in running:
        assert place(conn, job, 1).node == node
    placed = place(conn, new_job(conn), 1)
    assert placed.node is None
    assert placed.reason == "the one connected node is busy: it runs 6 attempts, its most"
    # Said lower (a restart with --max-jobs 2): nothing more until it runs fewer than 2.
    with conn.transaction():
        nodes.set_max_jobs(conn, node, 2)
        for job in running[:4]:
            store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
    assert place(conn, new_job(conn), 1).node is None
    with conn.transaction():
        store.end_attempt(conn, running[4].id, 1, EndReason.EXIT, 0)
    assert place(conn, new_job(conn), 1).node == node


@pytest.mark.parametrize("state", ["blocked", "pending", "rejected", "purging"])
def test_placement_takes_only_accepted_nodes_even_when_another_is_connected_and_idle(
    conn: psycopg.Connection[Any], state: str
) -> None:
    # A node in STATE that is still connected (its stream not yet closed): the state rule
    # alone must keep the job off it. It is idle and the accepted node busy, so any
    # placement that let it in would choose it first.
    other = add_node(conn, state=state)
    assert nodes.get(conn, other).connected
    accepted = add_node(conn)
    for _ in range(placement.NODE_SLOTS - 1):
        assert place(conn, new_job(conn, node=accepted), 1).node == accepted
    assert place(conn, new_job(conn), 1).node == accepted
    everywhere = new_job(conn, all=True)
    with conn.transaction():
        assert [p.node for p in placement.place_everywhere(conn, everywhere.id, 1)] == [accepted]
    # With the accepted node full, the job waits rather than go to the other one.
    queued = place(conn, new_job(conn), 1)
    assert queued.node is None and queued.reason is not None
    assert conn.execute(
        "SELECT count(*) FROM job_attempts WHERE node_id = %s", (other,)
    ).fetchone() == (0,)


def sealed_rows(conn: psycopg.Connection[Any], job_id: str) -> list[tuple[str, bytes]]:
    rows = conn.execute(
        "SELECT name, sealed FROM job_secrets WHERE job_id = %s ORDER BY name", (job_id,)
    ).fetchall()
    return [(r[0], bytes(r[1])) for r in rows]


def test_secrets_are_sealed_apart_sealed_to_the_placed_node_and_deleted_at_any_end(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    keeper = secret_env.SecretKeeper("test", pki.read_master_key(one_cluster.master_key))
    value = "v-" + secrets.token_hex(8)
    node_key = certs.new_private_key()
    node = add_node(conn)
    cert = pki.new_ca("test", "cluster").issue(
        node_key.public_key(), name=node, role=pki.Role.NODE, validity=pki.NODE_VALIDITY
    )
    conn.execute(
        "UPDATE nodes SET certificate = %s WHERE id = %s", (pki.cert_to_pem(cert).decode(), node)
    )
    job = new_job(conn, keeper, secret_env={"DB_PASSWORD": value})
    assert job.secret_env == ["DB_PASSWORD"] and job.to_json()["secret_env"] == ["DB_PASSWORD"]
    [(name, sealed)] = sealed_rows(conn, job.id)
    assert name == "DB_PASSWORD" and value.encode() not in sealed
    assert keeper.unseal(job.id, name, sealed) == value
    row = conn.execute("SELECT j::text FROM jobs j WHERE id = %s", (job.id,)).fetchone()
    audited = conn.execute("SELECT details::text FROM audit_log").fetchall()
    assert row is not None and value not in row[0] and value not in str(audited)

    placed = place(conn, job, 1)
    with conn.transaction():
        text = secret_env.for_attempt(conn, keeper, job.id, 1, node)
    opened = sealed_env.open_sealed(node_key, text, job_id=job.id, attempt=1, node_id=node)
    assert placed.node == node and opened == {"DB_PASSWORD": value}
    with conn.transaction():
        store.finish(conn, job.id, "succeeded", 0, None)
    assert sealed_rows(conn, job.id) == []
    with pytest.raises(secret_env.SecretsUnavailable, match="no longer kept"):
        secret_env.for_attempt(conn, keeper, job.id, 2, node)

    # A cancel before any workflow ends the job at once: its secrets go with it.
    cancelled = new_job(conn, keeper, secret_env={"DB_PASSWORD": value})
    with conn.transaction():
        store.request_cancel(conn, cancelled.id, ADMIN)
    assert sealed_rows(conn, cancelled.id) == []

    # A job without secrets hands over none; one with secrets needs a keeper.
    assert secret_env.for_attempt(conn, None, new_job(conn).id, 1, node) == ""
    with pytest.raises(secret_env.SecretsUnavailable):
        new_job(conn, None, secret_env={"DB_PASSWORD": value})


# --- retention (pruner.py) and the queued-jobs cap --------------------------------------


def ended_with_output(conn: psycopg.Connection[Any], node: str, chunks: int) -> store.Job:
    """A job that ran on NODE, wrote CHUNKS rows of output and ended, as its workflow's
    steps record it."""
    job = new_job(conn, node=node)
    assert place(conn, job, 1).node == node
    with conn.transaction():
        for seq in range(chunks):
            assert store.append_output(conn, node, job.id, 1, seq, "stdout", b"line\n", False)
        store.end_attempt(conn, job.id, 1, EndReason.EXIT, 0)
        store.finish(conn, job.id, "succeeded", 0, None)
    return job


def ended_ago(conn: psycopg.Connection[Any], job: store.Job, days: float) -> None:
    """Move JOB's end (and its attempts') DAYS back, as if it had ended then."""
    conn.execute(
        "UPDATE jobs SET ended_at = now() - make_interval(secs => %s),"
        " created_at = now() - make_interval(secs => %s) WHERE id = %s",
        (days * 86400, days * 86400 + 60, job.id),
    )


def rows_of(conn: psycopg.Connection[Any], job_id: str) -> tuple[int, int, int]:
    """(job rows, attempt rows, output rows) kept of JOB_ID."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM jobs WHERE id = %(j)s),"
        " (SELECT count(*) FROM job_attempts WHERE job_id = %(j)s),"
        " (SELECT count(*) FROM job_output WHERE job_id = %(j)s)",
        {"j": job_id},
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1]), int(row[2])


def prune(
    one_cluster: ClusterFiles, deleted: Callable[[pruner.Pruned], None] = lambda _: None
) -> pruner.Pruned:
    async def one_pass() -> pruner.Pruned:
        async with open_database(one_cluster.main_db, min_size=1, max_size=2) as db:
            return await pruner.prune(db, pause=0, deleted=deleted)

    return trio.run(one_pass)


def test_a_finished_job_past_its_tenants_retention_goes_with_its_attempts_and_output(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    node = add_node(conn)
    old, young = ended_with_output(conn, node, 3), ended_with_output(conn, node, 2)
    ended_ago(conn, old, 31)  # the default retention is 30 days
    ended_ago(conn, young, 29)
    assert rows_of(conn, old.id) == (1, 1, 3)
    # Each batch is told as soon as it is deleted (the metrics count it then, not at the
    # pass's end: a job the API no longer finds is counted already).
    told: list[tuple[pruner.Pruned, tuple[int, int, int]]] = []
    done = prune(one_cluster, lambda batch: told.append((batch, rows_of(conn, old.id))))
    assert (done.jobs, done.attempts, done.output_rows) == (1, 1, 3)
    assert [(b.output_rows, b.jobs, b.attempts) for b, _ in told] == [(3, 0, 0), (0, 1, 1)]
    assert [rows for _, rows in told] == [(1, 1, 0), (0, 0, 0)]
    assert rows_of(conn, old.id) == (0, 0, 0)
    assert rows_of(conn, young.id) == (1, 1, 2)
    # A shorter retention of the tenant's own takes the younger one too.
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(job_retention=7 * 86400), ADMIN)
    assert prune(one_cluster).jobs == 1 and rows_of(conn, young.id) == (0, 0, 0)


def test_queued_and_running_jobs_are_never_pruned_however_old(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    node = add_node(conn)
    queued, running = new_job(conn), new_job(conn, node=node)
    assert place(conn, running, 1).node == node
    conn.execute("UPDATE jobs SET created_at = now() - interval '400 days'")
    # Even a row that says it ended long ago is kept while its state is not an end.
    conn.execute("UPDATE jobs SET ended_at = now() - interval '400 days' WHERE id = %s",
                 (running.id,))  # fmt: skip
    assert prune(one_cluster).jobs == 0
    assert rows_of(conn, queued.id)[0] == 1 and rows_of(conn, running.id)[:2] == (1, 1)


def test_an_expired_jobs_output_goes_in_deletes_of_a_bounded_number_of_rows(
    conn: psycopg.Connection[Any],
) -> None:
    job = ended_with_output(conn, add_node(conn), 5)
    ended_ago(conn, job, 31)
    with conn.transaction():
        [expired] = pruner.expired_jobs(conn, "default", 30 * 86400)
    assert expired == job.id
    counts = []
    while True:
        with conn.transaction():
            deleted = pruner.delete_some_output(conn, [job.id], limit=2)
        if not deleted:
            break
        counts.append(deleted)
    assert counts == [2, 2, 1]
    with conn.transaction():
        assert pruner.delete_jobs(conn, [job.id]) == (1, 1)


def test_audit_rows_are_pruned_only_when_the_cluster_sets_a_retention(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    for age in (500, 10, 0):
        audit.record(conn, ADMIN, "test.row", f"test:{age}")
        conn.execute(
            "UPDATE audit_log SET at = now() - make_interval(days => %s) WHERE target = %s",
            (age, f"test:{age}"),
        )
    assert prune(one_cluster).audit_rows == 0, "kept for ever by default"
    with conn.transaction():
        assert audit.set_retention(conn, 30 * 86400, ADMIN) is None
    assert prune(one_cluster).audit_rows == 1
    targets = [r[0] for r in conn.execute("SELECT target FROM audit_log ORDER BY id")]
    assert targets == ["test:10", "test:0", "cluster"]
    [details] = conn.execute(
        "SELECT details FROM audit_log WHERE action = 'cluster.set'"
    ).fetchone() or [None]
    assert details == {"audit_retention": {"from": "keep", "to": "30d"}}


def test_one_server_claims_a_due_pruning_pass_and_a_shorter_retention_makes_one_due(
    conn: psycopg.Connection[Any],
) -> None:
    with conn.transaction():
        assert pruner.claim_pass(conn)
    with conn.transaction():
        assert not pruner.claim_pass(conn), "the next pass is PASS_EVERY away"
    with conn.transaction():
        before, after = tenants.change(
            conn, "default", tenants.Settings(job_retention=12 * 3600), ADMIN
        )
    assert (before.job_retention, after.job_retention) == (30 * 86400, 12 * 3600)
    with conn.transaction():
        assert pruner.claim_pass(conn)
    [details] = conn.execute(
        "SELECT details FROM audit_log WHERE action = 'tenant.set'"
    ).fetchone() or [None]
    assert details == {"job_retention": {"from": "30d", "to": "12h"}}


def test_a_job_past_the_tenants_queued_cap_is_refused_and_nothing_is_made(
    conn: psycopg.Connection[Any],
) -> None:
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(max_queued_jobs=2), ADMIN)
    first, _ = new_job(conn), new_job(conn)
    with pytest.raises(TooManyQueued) as refused:
        new_job(conn)
    assert str(refused.value) == (
        "tenant default has 2 jobs queued, its limit (tenant set --max-queued-jobs);"
        " wait or cancel some"
    )
    assert conn.execute("SELECT count(*) FROM jobs").fetchone() == (2,)
    assert conn.execute("SELECT count(*) FROM audit_log WHERE action = 'job.run'").fetchone() == (
        2,
    )
    with conn.transaction():
        store.request_cancel(conn, first.id, ADMIN)
    new_job(conn)  # one left the queue: room for one


def test_jobs_run_at_once_cannot_pass_the_queued_cap_together(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    cap, tries = 3, 12
    with conn.transaction():
        tenants.change(conn, "default", tenants.Settings(max_queued_jobs=cap), ADMIN)
    start = threading.Barrier(tries)
    outcomes: list[str] = []

    def run_one() -> None:
        with psycopg.connect(one_cluster.main_db, autocommit=True) as mine:
            spec = JobSpec.from_json({"command": ["true"]})
            start.wait(timeout=10)
            try:
                with mine.transaction():
                    store.create(mine, spec, ADMIN)
                outcomes.append("made")
            except TooManyQueued:
                outcomes.append("refused")

    threads = [threading.Thread(target=run_one) for _ in range(tries)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert sorted(outcomes) == ["made"] * cap + ["refused"] * (tries - cap)
    assert conn.execute("SELECT count(*) FROM jobs WHERE state = 'queued'").fetchone() == (cap,)


def test_on_lost_and_lost_after_are_kept_with_the_job(conn: psycopg.Connection[Any]) -> None:
    job = new_job(conn, on_lost="wait", lost_after=1800)
    assert (job.on_lost, job.lost_after) == ("wait", 1800.0)
    assert {k: job.to_json()[k] for k in ("on_lost", "lost_after")} == {
        "on_lost": "wait",
        "lost_after": 1800.0,
    }
    plain = new_job(conn)
    assert (plain.on_lost, plain.lost_after) == ("move", None)
    # A job written by a server older than them (neither column given) moves, by default.
    conn.execute(
        "INSERT INTO jobs (id, tenant, command, queue_timeout_s, created_by) VALUES"
        " ('job-00000000a0a0', 'default', '[\"true\"]', 600, 'operator:admin')"
    )
    older = store.get(conn, "job-00000000a0a0")
    assert (older.on_lost, older.lost_after) == ("move", None)


def test_what_each_reported_attempt_is_to_a_node_is_one_batch_in_order(
    conn: psycopg.Connection[Any],
) -> None:
    node, other = add_node(conn), add_node(conn)
    running, ended, cancelled = (new_job(conn, node=node) for _ in range(3))
    theirs = new_job(conn, node=other)
    for job in (running, ended, cancelled, theirs):
        assert place(conn, job, 1).node is not None
    with conn.transaction():
        store.end_attempt(conn, ended.id, 1, EndReason.EXIT, 0)
        store.finish(conn, cancelled.id, "cancelled", None, "cancelled by an operator")
    asked = [
        (theirs.id, 1), (running.id, 1), (running.id, 2), (ended.id, 1), ("job-0000000000ff", 1),
        (cancelled.id, 1), (running.id, 1),
    ]  # fmt: skip
    with conn.transaction():
        answers = store.attempts_of_node(conn, node, asked)
    assert answers == [
        store.NOT_ITS, store.RUNNING, store.NOT_ITS, store.ENDED, store.NOT_ITS,
        store.CANCELLED, store.RUNNING,
    ]  # fmt: skip
    assert store.attempts_of_node(conn, other, [(theirs.id, 1)]) == [store.RUNNING]
    assert store.attempts_of_node(conn, node, []) == []


def everything_of(conn: psycopg.Connection[Any], job_id: str) -> list[tuple[Any, ...]]:
    """The job's row and its attempts' rows as text, but for when they were written."""
    rows = conn.execute(
        "SELECT state, exit_code, reason, ended_at IS NULL FROM jobs WHERE id = %(j)s",
        {"j": job_id},
    ).fetchall()
    rows += conn.execute(
        "SELECT number, part, node_id, state, ended_because, exit_code FROM job_attempts"
        " WHERE job_id = %(j)s ORDER BY number",
        {"j": job_id},
    ).fetchall()
    return rows


def test_every_step_run_twice_answers_the_same_and_records_once(
    conn: psycopg.Connection[Any],
) -> None:
    """The workflow's database steps are local activities (JobInput.local_steps): one whose
    workflow task did not complete (its server stopped, the task timed out) is run again by
    the next worker, after it had committed. Each step, the real one, run a second time
    right after the first: the same answer, and nothing more in the database."""
    # What the server's metrics are told of each job's end: once, however often its step runs.
    ended: list[tuple[str, store.JobTimes]] = []
    steps = JobActivities(
        OneConnection(conn),  # type: ignore[arg-type]
        AttemptSigner(pki.new_ca("steps-twice", "cluster")),
        on_ended=lambda state, times: ended.append((state, times)),
    )
    a, b = add_node(conn), add_node(conn)

    def twice(call: Callable[[], Coroutine[Any, Any, T]], job_id: str) -> T:
        first: T = asyncio.run(call())
        after_first = everything_of(conn, job_id)
        again: T = asyncio.run(call())
        assert everything_of(conn, job_id) == after_first, "the second run wrote again"
        if isinstance(first, Placed) and isinstance(again, Placed):
            # The grant is signed anew (its not_after moves): the same attempt, node, secrets.
            assert (again.number, again.node, again.part, again.secrets) == (
                first.number, first.node, first.part, first.secrets,
            )  # fmt: skip
        elif isinstance(first, list) and isinstance(again, list):
            assert [(p.number, p.node, p.part) for p in again] == [
                (p.number, p.node, p.part) for p in first
            ]
        else:
            assert again == first
        return first

    one = new_job(conn)
    placed = twice(lambda: steps.place(one.id, 1, 0, []), one.id)
    assert placed.node in (a, b) and placed.grant
    assert (
        twice(lambda: steps.end_attempt(AttemptEnd(one.id, 1, EndReason.EXIT, 2)), one.id) == "exit"
    )
    again = twice(lambda: steps.place(one.id, 2, 0, [str(placed.node)]), one.id)
    assert again.node != placed.node
    twice(lambda: steps.end_attempt(AttemptEnd(one.id, 2, EndReason.EXIT, 0)), one.id)
    twice(lambda: steps.finish(Finish(one.id, "succeeded", 0, None)), one.id)
    assert everything_of(conn, one.id)[0] == ("succeeded", 0, None, False)
    [(state, times)] = ended
    assert state == "succeeded" and times.waited is not None and 0 <= times.waited <= times.total

    everywhere = new_job(conn, all=True)
    parts = twice(lambda: steps.place_everywhere(everywhere.id, 1), everywhere.id)
    assert sorted(str(p.node) for p in parts) == sorted([a, b])
    twice(lambda: steps.end_attempt(AttemptEnd(everywhere.id, 1, EndReason.EXIT, 1)), everywhere.id)
    retried = twice(
        lambda: steps.place_on(everywhere.id, 3, parts[0].part, str(parts[0].node)),
        everywhere.id,
    )
    assert (retried.number, retried.node) == (3, parts[0].node)
    twice(lambda: steps.finish(Finish(everywhere.id, "cancelled", None, "x")), everywhere.id)
    assert len(everything_of(conn, everywhere.id)) == 1 + 3
    assert [state for state, _ in ended] == ["succeeded", "cancelled"]


def test_a_job_s_steps_are_local_only_while_every_server_up_runs_them(
    conn: psycopg.Connection[Any],
) -> None:
    """A worker of a release before local steps cannot replay a workflow that has them, so
    the sweeper starts jobs with them only while no such server is up."""
    old = "server-00000000000a"
    conn.execute("UPDATE servers SET schema_version = %s", (inputs.LOCAL_STEPS_SCHEMA,))
    assert inputs.everywhere(conn).local_steps
    conn.execute(
        "INSERT INTO servers (id, advertise, version, schema_version)"
        " VALUES (%s, '127.0.0.1', 'older', %s)",
        (old, inputs.LOCAL_STEPS_SCHEMA - 1),
    )
    assert not inputs.everywhere(conn).local_steps
    conn.execute("UPDATE servers SET schema_version = NULL WHERE id = %s", (old,))
    assert not inputs.everywhere(conn).local_steps, "a server too old to say its schema"
    conn.execute(
        "UPDATE servers SET last_heartbeat = now() - interval '1 hour' WHERE id = %s", (old,)
    )
    assert inputs.everywhere(conn).local_steps, "a server long gone holds nothing back"


def test_jobs_look_for_unheard_attempts_only_while_every_server_up_has_the_check(
    conn: psycopg.Connection[Any],
) -> None:
    """A worker of a release before the check (oz0/jobs/heard.py) could not replay a
    workflow that makes it: the sweeper starts jobs with it only while none is up."""
    conn.execute("UPDATE servers SET schema_version = %s", (inputs.WATCH_HEARD_SCHEMA,))
    assert inputs.everywhere(conn) == inputs.Everywhere(True, watch_heard=True, first_placed=True)
    conn.execute(
        "INSERT INTO servers (id, advertise, version, schema_version)"
        " VALUES ('server-00000000000b', '127.0.0.1', 'older', %s)",
        (inputs.WATCH_HEARD_SCHEMA - 1,),
    )
    runs = inputs.everywhere(conn)
    assert runs == inputs.Everywhere(local_steps=True, watch_heard=False, first_placed=False)
    job = new_job(conn)
    assert inputs.job_input(job, runs).watch_heard is False
    assert inputs.job_input(job, inputs.Everywhere(True, True)).watch_heard is True
    # Only with local steps: the check is made the way the job's other steps are.
    assert inputs.job_input(job, inputs.Everywhere(False, True)).watch_heard is False


def test_a_job_whose_cancel_was_asked_for_before_its_workflow_heard_is_placed_nowhere(
    conn: psycopg.Connection[Any],
) -> None:
    """A schedule's run makes its job (workflow started, as far as the sweeper knows) and
    starts the job's workflow a moment later: a cancel asked for in between finds no
    workflow to tell. The workflow's first placement ends it instead of running it."""
    add_node(conn)
    for fields in ({}, {"all": True}, {"all": True, "batch": "1"}):
        job = new_job(conn, **fields)
        conn.execute("UPDATE jobs SET workflow_started = true WHERE id = %s", (job.id,))
        with conn.transaction():
            store.request_cancel(conn, job.id, ADMIN)
        # The row the placement locks says so itself: no second query for it.
        assert store.locked_job(conn, job.id).cancel_requested
        assert not store.get(conn, new_job(conn).id).cancel_requested
        with conn.transaction():
            if fields.get("batch"):
                [placed] = placement.list_parts(conn, job.id)
            elif fields.get("all"):
                [placed] = placement.place_everywhere(conn, job.id, 1)
            else:
                placed = placement.place(conn, job.id, 1, 0, [])
        assert placed.ended and placed.node is None, (fields, placed)
        assert store.get(conn, job.id).attempts == ()


def test_the_sweeper_places_a_one_node_job_s_first_attempt_as_it_claims_it(
    conn: psycopg.Connection[Any],
) -> None:
    """The claim's transaction places the first attempt of each claimed one-node job with a
    node free, granted as the workflow's step would (the workflow hands it out in its first
    task); `--all` jobs, jobs with secrets or none free are left to the workflow's step."""
    conn.execute("UPDATE servers SET schema_version = %s", (inputs.FIRST_PLACED_SCHEMA,))
    ca = pki.new_ca("first-placed", "cluster")
    placer = JobActivities(OneConnection(conn), AttemptSigner(ca))  # type: ignore[arg-type]
    node = add_node(conn, labels={"role": "web"})
    one = new_job(conn, selector={"role": "web"})
    everywhere = new_job(conn, selector={"role": "web"}, all=True)
    nowhere = new_job(conn, selector={"role": "gpu"})
    with conn.transaction():
        claimed, runs, firsts = claim_for_start(conn, placer)
    assert {j.id for j in claimed} >= {one.id, everywhere.id, nowhere.id}
    assert runs.first_placed
    first = firsts[one.id]
    assert first is not None and (first.number, first.node, first.part) == (1, node, 0)
    assert first.grant is not None and first.grant["payload"]
    assert firsts[everywhere.id] is None and firsts[nowhere.id] is None
    assert inputs.job_input(one, runs, first).first == first
    [attempt] = attempts_of(conn, one.id)
    assert attempt[:2] == (1, node)
    assert attempts_of(conn, everywhere.id) == [] and attempts_of(conn, nowhere.id) == []
    # Placed again (a start that failed, claimed again): the same attempt, nothing more.
    again = placer.first_placed(conn, one)
    assert again is not None and (again.number, again.node) == (1, node)
    assert len(attempts_of(conn, one.id)) == 1
    # While a server of an older release is up, the workflow places it, as before.
    later = new_job(conn, selector={"role": "web"})
    conn.execute(
        "INSERT INTO servers (id, advertise, version, schema_version)"
        " VALUES ('server-00000000000c', '127.0.0.1', 'older', %s)",
        (inputs.FIRST_PLACED_SCHEMA - 1,),
    )
    with conn.transaction():
        claimed, runs, firsts = claim_for_start(conn, placer)
    assert later.id in {j.id for j in claimed} and firsts[later.id] is None
    assert attempts_of(conn, later.id) == []
    assert inputs.job_input(one, runs, first).first is None


def attempts_of(conn: psycopg.Connection[Any], job_id: str) -> list[tuple[Any, ...]]:
    return conn.execute(
        "SELECT number, node_id FROM job_attempts WHERE job_id = %s ORDER BY number", (job_id,)
    ).fetchall()
