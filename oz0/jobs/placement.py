"""Placement: which node runs a job's attempt, recorded in the same transaction as the
choice; or, when no node can take it now, why (what `job show` says while it waits).

Candidates are accepted, connected nodes (oz0.nodes.CONNECTED) of the job's tenant with
every label of its selector, and its one node if it names one; a node runs at most as many
attempts as it says it takes (`oz0-node start --max-jobs`, the row's max_jobs; NODE_SLOTS
until it says).

What it answers is the workflow's own Placed (where attempt NUMBER runs, or, node None,
why no node can take it now; `ended`: the job ended meanwhile, nothing to run), without a
grant or sealed secrets yet: activities.py adds them in the same transaction.
"""

from __future__ import annotations

from psycopg.types.json import Jsonb

from oz0 import listing, nodes
from oz0.jobs.spec import JobNotFound
from oz0.jobs.store import (
    Conn,
    Job,
    gone_because,
    locked_job,
    node_fate,
    set_queued,
    tell_followers,
)
from oz0.jobs.workflow import Placed


def _cancelled(job: Job) -> bool:
    """Whether JOB, about to be placed, is to run no more: ended, or its cancel asked for
    (which its workflow may never hear: a schedule's run starts the job's workflow a moment
    after it made the job, and a sweeper that came between found no workflow to tell)."""
    return job.ended or job.cancel_requested


# How many of the least busy candidates a placement tries to take, the ones being placed on
# by other transactions (locked) passed over, before it waits for the first.
TAKE_AMONG = 8
ROUNDS, ROUND_PAUSE = 20, 0.005


def _take_node(conn: Conn, node_id: str, *, wait: bool) -> bool | None:
    """NODE_ID's placement lock for this transaction: waited for if WAIT, else None when
    another transaction holds it. Taken, whether a slot is still free on the node: read in
    a statement of its own, after the lock, so it sees the attempts of the placements that
    held it before. Only placings on one same node wait for each other: the jobs of a
    tenant place side by side."""
    key = ("oz0.jobs.place-node:" + node_id,)
    if wait:
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", key)
    else:
        row = conn.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", key).fetchone()
        if not (row and row[0]):
            return None
    free = conn.execute(
        f"SELECT {_RUNNING_ON_NODE} < nodes.max_jobs FROM nodes WHERE nodes.id = %s", (node_id,)
    ).fetchone()
    return bool(free and free[0])


# A node runs as many attempts at once as its row's max_jobs (what its agent said on its
# control stream; this by default, oz0_node.identity.DEFAULT_MAX_JOBS): an attempt is placed
# only where a slot is free, so none waits on a full node's queue.
NODE_SLOTS = 4
_RUNNING_ON_NODE = (
    "(SELECT count(*) FROM job_attempts a WHERE a.node_id = nodes.id AND a.state = 'running')"
)


def _matching(job: Job) -> listing.Where:
    """The accepted nodes of JOB's tenant with every label of its selector, and its one
    node if it names one: by listing.Where's rule, the node is named only when given, so
    that a prepared statement's generic plan reads it by its key."""
    where = (
        listing.Where()
        .also("nodes.tenant = %(tenant)s", tenant=job.tenant)
        .also("nodes.state = 'accepted'")
        .also("nodes.labels @> %(selector)s", selector=Jsonb(job.selector))
    )
    return where if job.node is None else where.also("nodes.id = %(node)s", node=job.node)


def _candidates(job: Job) -> listing.Where:
    """Those of `_matching` connected now."""
    return _matching(job).also(nodes.CONNECTED, **nodes.CONNECTED_PARAMS)


def place(conn: Conn, job_id: str, number: int, part: int, tried: list[str]) -> Placed:
    """Pick the node for attempt NUMBER and record it running there, in one transaction.

    Accepted, connected nodes of the job's tenant matching every selector label; nodes in
    TRIED last; the least busy first. Given the same NUMBER again (an activity retried
    after its answer was lost), the attempt already recorded is the answer.
    """
    job = locked_job(conn, job_id)
    existing = conn.execute(
        "SELECT node_id FROM job_attempts WHERE job_id = %s AND number = %s", (job_id, number)
    ).fetchone()
    if existing is not None:
        return Placed(number, existing[0])
    if _cancelled(job):
        return Placed(number, None, ended=True)
    node_id = _least_busy_free(conn, job, tried)
    if node_id is None:
        reason = _why_no_node(conn, job)
        set_queued(conn, job_id, reason)
        return Placed(number, None, reason)
    _start_attempt(conn, job_id, number, part, node_id)
    return Placed(number, node_id)


def _least_busy_free(conn: Conn, job: Job, tried: list[str]) -> str | None:
    """The node for JOB's next attempt, its placement lock held: a connected candidate
    with a free slot, those in TRIED last, the least busy first (TAKE_AMONG of them); the
    first whose lock is free and that still has a slot then. While every one is being
    placed on by another transaction, it looks again (ROUNDS at most, ROUND_PAUSE apart),
    and waits for the least busy one's lock only while it holds none itself, so no two
    placings ever wait on each other. None: no node can take it now."""
    candidates = _candidates(job).also(f"{_RUNNING_ON_NODE} < nodes.max_jobs")
    full: list[str] = []  # locked by this transaction, and found full
    for _ in range(ROUNDS):
        found = [
            str(r[0])
            for r in conn.execute(
                "SELECT nodes.id FROM nodes" + candidates.sql + " AND nodes.id <> ALL(%(full)s)"
                + f" ORDER BY nodes.id = ANY(%(tried)s), {_RUNNING_ON_NODE}, random()"
                " LIMIT %(among)s",
                {**candidates.params, "tried": tried, "among": TAKE_AMONG, "full": full},
            )
        ]  # fmt: skip
        if not found:
            return None
        for node_id in found:
            free = _take_node(conn, node_id, wait=False)
            if free:
                return node_id
            if free is not None:
                full.append(node_id)
        if not full:
            # Every one is being placed on, and this transaction holds no node's lock:
            # the least busy one's is waited for.
            if _take_node(conn, found[0], wait=True):
                return found[0]
            full.append(found[0])
            continue
        conn.execute("SELECT pg_sleep(%s)", (ROUND_PAUSE,))
    return None


def place_everywhere(conn: Conn, job_id: str, first_number: int) -> list[Placed]:
    """For a job run on all matching nodes: one attempt on each node that matches now
    (none: the job is queued, with the reason). Idempotent like `place`."""
    job = locked_job(conn, job_id)
    existing = conn.execute(
        "SELECT number, node_id, part FROM job_attempts WHERE job_id = %s ORDER BY number",
        (job_id,),
    ).fetchall()
    if existing:
        return [Placed(r[0], r[1], part=r[2]) for r in existing]
    if _cancelled(job):
        return [Placed(first_number, None, ended=True)]
    # No lock: a part goes on its node whether or not a slot is free (it waits there).
    candidates = _candidates(job)
    found = [
        r[0]
        for r in conn.execute(
            "SELECT nodes.id FROM nodes" + candidates.sql + " ORDER BY nodes.id", candidates.params
        )
    ]
    if not found:
        reason = _why_no_node(conn, job)
        set_queued(conn, job_id, reason)
        return [Placed(first_number, None, reason)]
    # One statement for every part (a fan-out to a thousand nodes is one insert).
    conn.execute(
        "INSERT INTO job_attempts (job_id, number, part, node_id)"
        " SELECT %s, %s + n - 1, n - 1, node_id"
        " FROM unnest(%s::text[]) WITH ORDINALITY AS u(node_id, n)",
        (job_id, first_number, found),
    )
    _started(conn, job_id)
    return [Placed(first_number + part, node_id, part=part) for part, node_id in enumerate(found)]


def list_parts(conn: Conn, job_id: str) -> list[Placed]:
    """For a rolling batch (`--batch`): the parts, one per node that matches now, each
    recorded waiting for its slot; part P's first attempt will be number P + 1. None
    matching: the job is queued, with the reason. Idempotent like `place`: the parts
    recorded already are the answer.

    No attempt is recorded yet: each is placed as its slot opens (`place_part`), with a
    grant good from then, so a part that waits an hour holds nothing that expires."""
    job = locked_job(conn, job_id)
    existing = conn.execute(
        "SELECT part, node_id FROM job_parts WHERE job_id = %s ORDER BY part", (job_id,)
    ).fetchall()
    if existing:
        return [Placed(part + 1, node_id, part=part) for part, node_id in existing]
    if _cancelled(job):
        return [Placed(1, None, ended=True)]
    candidates = _candidates(job)
    found = [
        str(r[0])
        for r in conn.execute(
            "SELECT nodes.id FROM nodes" + candidates.sql + " ORDER BY nodes.id", candidates.params
        )
    ]
    if not found:
        reason = _why_no_node(conn, job)
        set_queued(conn, job_id, reason)
        return [Placed(1, None, reason)]
    conn.execute(
        "INSERT INTO job_parts (job_id, part, node_id)"
        " SELECT %s, n - 1, node_id FROM unnest(%s::text[]) WITH ORDINALITY AS u(node_id, n)",
        (job_id, found),
    )
    # Started: its rollout has begun (and it no longer counts against the tenant's queue).
    conn.execute(
        "UPDATE jobs SET state = 'running', reason = NULL, started_at = coalesce(started_at,"
        " now()) WHERE id = %s AND ended_at IS NULL",
        (job_id,),
    )
    tell_followers(conn, job_id)
    return [Placed(part + 1, node_id, part=part) for part, node_id in enumerate(found)]


def place_part(conn: Conn, job_id: str, number: int, part: int, node_id: str) -> Placed:
    """A batch's part PART, its slot open: its first attempt NUMBER recorded on its node;
    or, if the node was blocked, purged or deleted while the part waited, the part not
    started, with why (node None, reason "node blocked" and so on: the workflow counts it
    lost, as a part whose node is taken away while it runs). Idempotent like `place`."""
    job = locked_job(conn, job_id)
    row = conn.execute(
        "SELECT state, because FROM job_parts WHERE job_id = %s AND part = %s FOR UPDATE",
        (job_id, part),
    ).fetchone()
    if row is None:
        raise JobNotFound(f"job {job_id} has no part {part}")
    state, because = row
    if state == "placed":
        return Placed(number, node_id, part=part)
    if state == "not started":
        return Placed(number, None, because, ended=job.ended, part=part)
    if job.ended:
        return Placed(number, None, ended=True, part=part)
    fate = node_fate(conn, node_id)
    if fate != "accepted":
        because = gone_because(fate)
        conn.execute(
            "UPDATE job_parts SET state = 'not started', because = %s"
            " WHERE job_id = %s AND part = %s",
            (because, job_id, part),
        )
        tell_followers(conn, job_id)
        return Placed(number, None, because, part=part)
    _start_attempt(conn, job_id, number, part, node_id)
    conn.execute(
        "UPDATE job_parts SET state = 'placed' WHERE job_id = %s AND part = %s", (job_id, part)
    )
    return Placed(number, node_id, part=part)


def place_on(conn: Conn, job_id: str, number: int, part: int, node_id: str) -> None:
    """Attempt NUMBER of a part of an `--all` job, on its node again (a retry)."""
    found = conn.execute(
        "SELECT 1 FROM job_attempts WHERE job_id = %s AND number = %s", (job_id, number)
    ).fetchone()
    if found is None:
        _start_attempt(conn, job_id, number, part, node_id)


def _start_attempt(conn: Conn, job_id: str, number: int, part: int, node_id: str) -> None:
    conn.execute(
        "INSERT INTO job_attempts (job_id, number, part, node_id) VALUES (%s, %s, %s, %s)",
        (job_id, number, part, node_id),
    )
    _started(conn, job_id)


def _started(conn: Conn, job_id: str) -> None:
    conn.execute(
        "UPDATE jobs SET state = 'running', reason = NULL, started_at = coalesce(started_at,"
        " now()) WHERE id = %s AND ended_at IS NULL",
        (job_id,),
    )
    tell_followers(conn, job_id)


def _why_no_node(conn: Conn, job: Job) -> str:
    """What an operator reads in `job show` while the job waits for a node."""
    selector = ",".join(f"{k}={v}" for k, v in sorted(job.selector.items()))
    wanted = _matching(job)
    row = conn.execute(
        f"SELECT count(*), count(*) FILTER (WHERE {nodes.CONNECTED}),"
        f" max(nodes.max_jobs) FILTER (WHERE {nodes.CONNECTED}) FROM nodes" + wanted.sql,
        {**wanted.params, **nodes.CONNECTED_PARAMS},
    ).fetchone()
    matching, connected = (int(row[0]), int(row[1])) if row else (0, 0)
    if connected == 1:
        which = f"node {job.node}" if job.node else "the one connected node"
        return f"{which} is busy: it runs {row[2] if row else NODE_SLOTS} attempts, its most"
    if connected:
        return f"all {connected} connected nodes are busy: each runs as many attempts as it takes"
    if job.node:
        if matching:
            return f"node {job.node} is not connected"
        return f"node {job.node} is not accepted" + (
            f" or does not match {selector}" if selector else ""
        )
    nodes_of = f"accepted node of tenant {job.tenant}"
    matches = f" matching {selector}" if selector else ""
    if matching == 0:
        if selector:
            return f"no {nodes_of} matches {selector}"
        return f"tenant {job.tenant} has no accepted node"
    if matching == 1:
        return f"the one {nodes_of}{matches} is not connected"
    return f"none of the {matching} accepted nodes of tenant {job.tenant}{matches} is connected"
