"""The soak's end (issue 44): every job waited for until it has ended or its bound passed,
then what the checker (bench/soak_check.py) compares gathered: the ledger's runs, the
store's jobs, attempts (with the SHA-256 of each one's stored stdout) and audit rows, and
what the soak saw from outside (its changes, block probes, exits, samples).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter, defaultdict
from typing import Any

import trio

from bench.soak_model import AttemptRecord, JobRecord, Records, SessionRecord, read_ledger
from bench.soak_state import Soak
from bench.soak_workload import MARGIN, QUEUE_TIMEOUT

# Each server's database connections at most, as docs/run-a-cluster.md has operators size
# PostgreSQL for ("max_connections of at least 100 per server"): its pool (8), the
# membership's (1), its listeners, and its Temporal host's services, each with pools of
# its own (oz0/temporal/host/config.go: 10, and 4 for visibility).
CONNECTIONS_PER_SERVER = 100


def bounds(soak: Soak) -> dict[str, float]:
    """Each job's bound (wall clock): the workload's own, or for a job it did not make
    (a schedule's, or one whose answer was lost) one single attempt's."""
    with soak.store() as conn:
        rows = conn.execute("SELECT id, extract(epoch FROM created_at) FROM jobs").fetchall()
    found = {}
    for job_id, created in rows:
        known = soak.jobs.get(str(job_id))
        if known is not None:
            found[str(job_id)] = known[1] + known[0].bound
        else:
            found[str(job_id)] = float(created) + QUEUE_TIMEOUT + MARGIN + 60.0
    return found


def unended(soak: Soak) -> int:
    with soak.store() as conn:
        row = conn.execute("SELECT count(*) FROM jobs WHERE ended_at IS NULL").fetchone()
    return int(row[0]) if row else 0


async def drain(soak: Soak) -> float:
    """Until every job has ended, or the last bound passed. Seconds it took."""
    began = time.time()
    known = await trio.to_thread.run_sync(bounds, soak)
    last = max(known.values(), default=began)
    while time.time() < last:
        if await trio.to_thread.run_sync(unended, soak) == 0:
            break
        await trio.sleep(2.0)
    return time.time() - began


def records(soak: Soak, sessions: list[SessionRecord]) -> Records:
    with soak.store() as conn:
        jobs = conn.execute("SELECT id, state, extract(epoch FROM created_at) FROM jobs").fetchall()
        attempts = conn.execute(
            "SELECT job_id, number, part, node_id, state, exit_code, ended_because, truncated"
            " FROM job_attempts ORDER BY job_id, number"
        ).fetchall()
        digests: dict[tuple[str, int], Any] = defaultdict(hashlib.sha256)
        sizes: Counter[tuple[str, int]] = Counter()
        truncated: set[tuple[str, int]] = set()
        # A named cursor (the output is read in pieces) needs a transaction.
        with conn.transaction(), conn.cursor(name="output") as cursor:
            cursor.execute(
                "SELECT job_id, attempt, data, truncated FROM job_output"
                " WHERE stream = 'stdout' ORDER BY job_id, attempt, seq"
            )
            for job_id, attempt, data, cut in cursor:
                digests[(str(job_id), int(attempt))].update(bytes(data))
                sizes[(str(job_id), int(attempt))] += len(data)
                if cut:
                    truncated.add((str(job_id), int(attempt)))
        rows = conn.execute("SELECT action, target FROM audit_log").fetchall()
        audit = {(str(a), str(t)) for a, t in rows}
    bound = bounds(soak)
    listed: dict[str, list[AttemptRecord]] = defaultdict(list)
    empty = hashlib.sha256(b"").hexdigest()
    for job_id, number, part, node, state, code, because, cut in attempts:
        key = (str(job_id), int(number))
        listed[str(job_id)].append(
            AttemptRecord(
                int(number), int(part), str(node), str(state), code, because,
                bool(cut) or key in truncated,
                digests[key].hexdigest() if key in digests else empty, sizes[key],
            )
        )  # fmt: skip
    made = {job_id: plan for job_id, (plan, _) in soak.jobs.items()}
    found = []
    for j, s, c in jobs:
        plan = made.get(str(j))
        expect = plan.expect if plan is not None else None
        found.append(
            JobRecord(
                str(j), str(s), bound[str(j)], tuple(listed[str(j)]), soak.minute(float(c)),
                hashlib.sha256(expect).hexdigest() if expect is not None else None,
                plan is None or plan.ledgered,
            )
        )  # fmt: skip
    return Records(
        runs=read_ledger(soak.ledger.read()),
        jobs=found,
        audit=audit,
        changes=soak.changes,
        blocks=soak.blocks,
        pushes=soak.pushes,
        sessions=sessions,
        exits=soak.exits,
        host_exits=soak.host_exits,
        faults=soak.fault_spans,
        rss=soak.rss,
        connections=soak.connections,
        connection_bound=CONNECTIONS_PER_SERVER * len(soak.servers),
        minutes=soak.args.minutes,
        checked_at=time.time(),
        started_at=soak.started,
    )
