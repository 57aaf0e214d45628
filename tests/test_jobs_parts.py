"""Streamed parts' rows (oz0/jobs/parts.py) and placement without a tenant's lock, on a real
PostgreSQL with no server running (fixtures/job_rows.py): what placement writes for a node
that takes attempts over its stream, how a node's report becomes the part's end, what the
sweeper finds to tell, and jobs of one tenant placing side by side within each node's
`--max-jobs`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import OneConnection, add_node, new_job, place
from oz0 import nodes, pki
from oz0.jobs import inputs, parts, placement, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.role import claim_for_start
from oz0.jobs.workflow import LOST, STOPPED, PartEnd
from oz0_common.attempt_messages import AttemptResult, Failure

CLEAN = job_rows.CLEAN
CA = pki.new_ca("parts", "cluster")


def streaming_node(conn: psycopg.Connection[Any], **fields: Any) -> str:
    node = add_node(conn, **fields)
    with conn.transaction():
        parts.set_takes_stream(conn, node, True)
    return node


def claimed(conn: psycopg.Connection[Any], placer: JobActivities) -> dict[str, Any]:
    with conn.transaction():
        jobs, _, firsts = claim_for_start(conn, placer)
    return {"jobs": {j.id: j for j in jobs}, "firsts": firsts}


def stream_first(conn: psycopg.Connection[Any], job: store.Job) -> None:
    """JOB's first attempt placed (and, the job streamed and its node taking the stream,
    sent over it), as the sweeper's claim places it."""
    placer = JobActivities(OneConnection(conn), AttemptSigner(CA))  # type: ignore[arg-type]
    with conn.transaction():
        placed = placer.first_placed(conn, store.get(conn, job.id))
    assert placed is not None and placed.streamed


def report(node: str, job: str, number: int = 1, **how: Any) -> parts.Report:
    """A node's report, its result and failure written as on the wire."""
    if "result" in how:
        how["result"] = AttemptResult.parse(how["result"])
    if "failure" in how:
        how["failure"] = Failure(*how["failure"])
    return parts.Report(node, job, number, **how)


def test_a_part_placed_on_a_node_that_takes_the_stream_is_a_row_with_its_message(
    conn: psycopg.Connection[Any],
) -> None:
    """The sweeper's claim marks the job streamed (every server up at schema 25) and
    places its first attempt: its message (command, env, grant) in the row, a NOTIFY for
    the node, no grant for the workflow's history; a node that never said so (an older
    agent) gets an activity as before."""
    placer = JobActivities(OneConnection(conn), AttemptSigner(CA))  # type: ignore[arg-type]
    new, old = streaming_node(conn, labels={"a": "new"}), add_node(conn, labels={"a": "old"})
    on_new = new_job(conn, selector={"a": "new"}, env={"K": "V"}, limits={"cpu": 0.5})
    on_old = new_job(conn, selector={"a": "old"})
    conn.execute("LISTEN oz0_attempts")
    got = claimed(conn, placer)
    assert got["jobs"][on_new.id].streamed and got["jobs"][on_old.id].streamed
    first = got["firsts"][on_new.id]
    assert (first.node, first.streamed, first.grant, first.secrets) == (new, True, None, "")
    [waiting] = parts.waiting_for(conn, new)
    assert (waiting.job_id, waiting.number, waiting.lost_after) == (on_new.id, 1, 15.0)
    message = waiting.message
    assert message["command"] == ["true"] and message["env"] == {"K": "V"}
    assert message["limits"] == {"cpu": 0.5} and message["grant"]["signature"]
    assert [n.payload for n in conn.notifies(timeout=1, stop_after=1)] == [new]
    classic = got["firsts"][on_old.id]
    assert (classic.node, classic.streamed) == (old, False) and classic.grant is not None
    assert parts.waiting_for(conn, old) == []
    # Placed again (the step run twice): the same part, still one row waiting.
    again = placer.first_placed(conn, store.get(conn, on_new.id))
    assert again is not None and again.streamed and len(parts.waiting_for(conn, new)) == 1


@pytest.mark.parametrize(
    ("how", "end"),
    [
        ({"result": {"exit_code": 3, "ended_because": "exit"}}, PartEnd(1, EndReason.EXIT, 3)),
        (
            {"result": {"exit_code": None, "ended_because": "timeout"}},
            PartEnd(1, EndReason.TIMEOUT),
        ),
        ({"cancelled": True}, PartEnd(1, EndReason.CANCELLED)),
        (
            {"failure": ("SecretsUnreadable", "x")},
            PartEnd(1, EndReason.NODE_COULD_NOT_READ_SECRETS),
        ),
        ({"failure": ("NodeStopping", "x")}, PartEnd(1, EndReason.NODE_LOST, lost=STOPPED)),
        ({"failure": ("SupervisorLost", "x")}, PartEnd(1, EndReason.NODE_LOST)),
    ],
)
def test_a_nodes_report_is_its_parts_end_by_the_rules_of_an_activitys_end(
    conn: psycopg.Connection[Any], how: dict[str, Any], end: PartEnd
) -> None:
    node = streaming_node(conn)
    job = new_job(conn, node=node)
    with conn.transaction():
        store.set_streamed(conn, [job.id])
    stream_first(conn, job)
    with conn.transaction():
        [recorded] = parts.record_ends(conn, [report(node, job.id, **how)])
    assert (recorded.answer, recorded.job_id, recorded.tenant, recorded.end) == (
        parts.STORED, job.id, "default", end,
    )  # fmt: skip
    [attempt] = store.get(conn, job.id).attempts
    assert (attempt.state, attempt.ended_because) == ("ended", end.because)
    # Again (its ack was lost, the node sends it again): ended already, nothing written.
    with conn.transaction():
        assert parts.record_ends(conn, [report(node, job.id, **how)]) == [
            parts.Recorded(parts.ENDED)
        ]


def test_an_attempt_its_node_could_not_record_ends_so_once_every_server_up_knows_why(
    conn: psycopg.Connection[Any],
) -> None:
    """A node whose data directory is full fails the attempt (RecordUnwritable): it moves,
    `node could not record the attempt` (not `node lost`), the node's words kept as its
    detail. While a server of the previous release is up (its workers could not read that
    reason in the row or the signal): `node lost` as before, the detail kept all the same."""
    said = ("RecordUnwritable", "cannot record the attempt as run in /d/attempts-run: full")
    node = streaming_node(conn)
    conn.execute("UPDATE servers SET schema_version = %s", (inputs.UNRECORDED_SCHEMA,))
    found = []
    for older in (False, True):
        if older:
            conn.execute(
                "INSERT INTO servers (id, advertise, version, schema_version)"
                " VALUES ('server-00000000000c', '127.0.0.1', 'older', %s)",
                (inputs.UNRECORDED_SCHEMA - 1,),
            )
        job = new_job(conn, node=node)
        with conn.transaction():
            store.set_streamed(conn, [job.id])
        stream_first(conn, job)
        with conn.transaction():
            [recorded] = parts.record_ends(conn, [report(node, job.id, failure=said)])
        [attempt] = store.get(conn, job.id).attempts
        assert recorded.end is not None and recorded.end.because == attempt.ended_because
        assert recorded.end.because.moves
        found.append((attempt.ended_because, attempt.ended_detail))
    assert found == [
        (EndReason.NODE_COULD_NOT_RECORD, said[1]), (EndReason.NODE_LOST, said[1])
    ]  # fmt: skip


@pytest.mark.parametrize(
    "said",
    [{"truncated": True}, {"output_complete": False}, {}],
    ids=["cut on the node", "dropped by the agent", "whole"],
)
def test_a_part_whose_node_kept_less_output_than_printed_is_shown_truncated(
    conn: psycopg.Connection[Any], said: dict[str, Any]
) -> None:
    """The node's disk full: its supervisor could not write the output, nor the mark that
    would have told the stream; only the result says so. The attempt is shown truncated,
    not as whole output (bench.soak found one ended `exit` with nothing of what it
    printed)."""
    node = streaming_node(conn)
    job = new_job(conn, node=node)
    with conn.transaction():
        store.set_streamed(conn, [job.id])
    stream_first(conn, job)
    result = {"exit_code": 0, "output_bytes": 104, **said}
    with conn.transaction():
        [recorded] = parts.record_ends(conn, [report(node, job.id, result=result)])
    assert recorded.answer == parts.STORED
    [attempt] = store.get(conn, job.id).attempts
    assert (attempt.ended_because, attempt.truncated) == ("exit", bool(said))


def test_a_refusal_names_the_node_and_only_the_nodes_own_running_part_is_written(
    conn: psycopg.Connection[Any],
) -> None:
    node, stranger = streaming_node(conn), streaming_node(conn)
    job, classic = new_job(conn, node=node), new_job(conn, node=node)
    with conn.transaction():
        store.set_streamed(conn, [job.id])
    assert place(conn, classic, 1).node == node
    stream_first(conn, job)
    refused = report(node, job.id, failure=("AttemptRefused", "the grant expired"))
    with conn.transaction():
        answers = parts.record_ends(
            conn,
            [
                report(stranger, job.id, result={"exit_code": 0}),  # not its node's
                report(node, classic.id, result={"exit_code": 0}),  # an activity's
                report(node, job.id, 2, result={"exit_code": 0}),  # no such attempt
                refused,
            ],
        )
    assert [a.answer for a in answers] == [
        parts.ENDED, parts.NOT_STREAMED, parts.ENDED, parts.STORED
    ]  # fmt: skip
    assert answers[3].end == PartEnd(
        1, EndReason.REFUSED, refusal=f"node {node} refused attempt 1: the grant expired"
    )
    assert store.get(conn, classic.id).attempts[0].state == "running"


def test_ends_not_told_are_found_after_a_while_and_only_until_told(
    conn: psycopg.Connection[Any],
) -> None:
    node = streaming_node(conn)
    job = new_job(conn, node=node)
    with conn.transaction():
        store.set_streamed(conn, [job.id])
        conn.execute("UPDATE jobs SET workflow_started = true WHERE id = %s", (job.id,))
    stream_first(conn, job)
    with conn.transaction():
        parts.record_ends(conn, [report(node, job.id, result={"exit_code": 0})])
    assert parts.unsignalled_ends(conn) == [], "the edge that recorded it tells it first"
    conn.execute(
        "UPDATE job_attempts SET ended_at = now() - interval '1 minute' WHERE job_id = %s",
        (job.id,),
    )
    assert parts.unsignalled_ends(conn) == [
        parts.Untold("default", job.id, [PartEnd(1, EndReason.EXIT, 0)])
    ]
    with conn.transaction():
        parts.ends_signalled(conn, [(job.id, 1)])
    assert parts.unsignalled_ends(conn) == []


def test_a_part_whose_node_no_server_heard_from_for_its_lost_after_is_found_silent(
    conn: psycopg.Connection[Any],
) -> None:
    node, waiting_node = streaming_node(conn), streaming_node(conn)
    moving = new_job(conn, node=node)
    waiting = new_job(conn, node=waiting_node, on_lost="wait")
    with conn.transaction():
        store.set_streamed(conn, [moving.id, waiting.id])
    for j in (moving, waiting):
        stream_first(conn, j)
    assert parts.silent_parts(conn) == []
    # Placed 20 s ago; both nodes last heard from 20 s ago: past move's 15 s, not wait's 600.
    conn.execute("UPDATE job_attempts SET started_at = now() - interval '20 seconds'")
    conn.execute("UPDATE nodes SET last_seen = now() - interval '20 seconds'")
    assert parts.silent_parts(conn) == [(moving.id, "default", 1)]
    with conn.transaction():
        store.removal_signalled(conn, moving.id, 1)
    assert parts.silent_parts(conn) == []
    assert LOST == "lost"  # what the workflow records such a move as (EndReason.NODE_LOST)


def test_a_part_running_past_its_timeout_and_margin_without_a_word_ends_timed_out(
    conn: psycopg.Connection[Any],
) -> None:
    """Its node alive (it would be moved as silent otherwise) but saying nothing of a part
    60 s past its job's timeout: the sweeper ends it "timeout", as the activity's
    start-to-close did, and has its workflow told; a part within its time, or of a job
    with no timeout, runs on."""
    node = streaming_node(conn)
    late = new_job(conn, node=node, timeout=5)
    in_time = new_job(conn, node=node, timeout=120)
    endless = new_job(conn, node=node)
    with conn.transaction():
        store.set_streamed(conn, [late.id, in_time.id, endless.id])
    for j in (late, in_time, endless):
        stream_first(conn, j)
    assert parts.overdue_parts(conn) == []
    conn.execute("UPDATE job_attempts SET started_at = now() - interval '66 seconds'")
    conn.execute("UPDATE nodes SET last_seen = now()")
    assert parts.silent_parts(conn) == []
    [overdue] = parts.overdue_parts(conn)
    assert (overdue.node_id, overdue.job_id, overdue.number) == (node, late.id, 1)
    with conn.transaction():
        [told] = parts.end_overdue(conn, [overdue])
    assert (told.job_id, told.ends) == (late.id, [PartEnd(1, EndReason.TIMEOUT)])
    states = {j.id: store.get(conn, j.id).attempts[0] for j in (late, in_time, endless)}
    assert (states[late.id].state, states[late.id].ended_because) == ("ended", "timeout")
    assert states[in_time.id].state == states[endless.id].state == "running"
    assert parts.overdue_parts(conn) == []
    # The node's own word came first: nothing is written over it.
    with conn.transaction():
        assert parts.end_overdue(conn, [overdue]) == []


def test_jobs_of_one_tenant_place_side_by_side_while_one_placing_is_open(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    """A placement holds only its node's lock: another job of the same tenant places on
    another node meanwhile, within a lock timeout far shorter than the open transaction."""
    a, b = add_node(conn), add_node(conn)
    first, second = new_job(conn), new_job(conn)
    with psycopg.connect(one_cluster.main_db) as holder:
        held = placement.place(holder, first.id, 1, 0, [])  # its transaction left open
        with psycopg.connect(one_cluster.main_db) as other:
            other.execute("SET lock_timeout = '1s'")
            began = time.monotonic()
            beside = placement.place(other, second.id, 1, 0, [])
            other.commit()
            took = time.monotonic() - began
        holder.commit()
    assert {held.node, beside.node} == {a, b}
    assert took < 1.0, f"waited {took:.2f} s on the other placing"


def test_many_jobs_of_two_tenants_placed_at_once_keep_every_node_within_its_max_jobs(
    conn: psycopg.Connection[Any], one_cluster: ClusterFiles
) -> None:
    conn.execute("INSERT INTO tenants (name) VALUES ('acme')")
    ours = [add_node(conn) for _ in range(3)]
    theirs = [add_node(conn, tenant="acme") for _ in range(2)]
    for node in ours + theirs:
        with conn.transaction():
            nodes.set_max_jobs(conn, node, 2)
    jobs = [new_job(conn) for _ in range(10)] + [new_job(conn, tenant="acme") for _ in range(7)]
    start = threading.Barrier(len(jobs))
    placed: list[str | None] = []
    failed: list[BaseException] = []

    def place_one(job_id: str) -> None:
        try:
            with psycopg.connect(one_cluster.main_db) as mine:
                start.wait(timeout=10)
                placed.append(placement.place(mine, job_id, 1, 0, []).node)
                mine.commit()
        except BaseException as e:  # a deadlock, a timeout: the test says which
            failed.append(e)

    threads = [threading.Thread(target=place_one, args=(j.id,)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert failed == []
    running = dict(
        conn.execute(
            "SELECT node_id, count(*) FROM job_attempts WHERE state = 'running' GROUP BY node_id"
        ).fetchall()
    )
    assert max(running.values()) <= 2, running
    # Every slot is taken: six of ours and four of theirs; the rest wait, saying why.
    assert sum(running[n] for n in ours) == 6 and sum(running[n] for n in theirs) == 4
    assert placed.count(None) == 7


def test_an_all_jobs_parts_are_placed_and_sent_as_it_is_claimed_and_not_sent_again(
    conn: psycopg.Connection[Any],
) -> None:
    """A streamed `--all` job's parts go out in the sweeper's claim; the workflow's own
    step then finds them placed: the same parts, nothing signed or sent again."""
    placer = JobActivities(OneConnection(conn), AttemptSigner(CA))  # type: ignore[arg-type]
    web = [streaming_node(conn, labels={"role": "web"}) for _ in range(3)]
    job = new_job(conn, selector={"role": "web"}, all=True)
    conn.execute("LISTEN oz0_attempts")
    got = claimed(conn, placer)
    assert got["firsts"][job.id] is None, "the workflow gets no first attempt: it places"
    sent = sorted(n.payload for n in conn.notifies(timeout=1, stop_after=3))
    assert sent == sorted(web)
    assert sorted(w.job_id for n in web for w in parts.waiting_for(conn, n)) == [job.id] * 3
    with conn.transaction():
        again = placer._granted_all(
            conn, store.get(conn, job.id), placement.place_everywhere(conn, job.id, 1)
        )
    assert [(p.number, p.streamed, p.grant) for p in again] == [
        (1, True, None), (2, True, None), (3, True, None)
    ]  # fmt: skip
    assert list(conn.notifies(timeout=0.5, stop_after=1)) == [], "nothing sent again"
