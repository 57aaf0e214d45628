"""The jobs' rows on a real PostgreSQL as the workflow's steps change them: a cancel, a
job's sealed secrets, what each reported attempt is to a node, steps run twice, what
every server up can run, and the sweeper's first placement.

No server runs here: the nodes are rows (a server row heartbeating, nodes streamed to it),
and each call is one transaction, as the workflow's steps and the API make them
(fixtures/job_rows.py).
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import psycopg
import pytest

from fixtures import job_rows
from fixtures.cluster import ClusterFiles
from fixtures.job_rows import ADMIN, OneConnection, add_node, new_job, place
from oz0 import pki
from oz0.jobs import inputs, placement, secret_env, store
from oz0.jobs.activities import JobActivities
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.grant import AttemptSigner
from oz0.jobs.role import claim_for_start
from oz0.jobs.spec import JobEnded
from oz0.jobs.workflow import AttemptEnd, Finish, Placed
from oz0_common import certs, sealed_env

T = TypeVar("T")
CLEAN = job_rows.CLEAN


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
