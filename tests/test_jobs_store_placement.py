"""The jobs' rows on a real PostgreSQL: placement by tenant, selector and connection,
least busy first, tried nodes last, a node's slots, and attempts found to move.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them
(fixtures/job_rows.py).
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from fixtures import job_rows
from fixtures.job_rows import add_node, new_job, place
from oz0 import audit, nodes
from oz0.jobs import placement, store
from oz0.jobs.end_reasons import EndReason

CLEAN = job_rows.CLEAN


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
