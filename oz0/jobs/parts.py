"""Streamed parts: attempts that are rows sent over their node's control stream (issue 41),
not Temporal activities. Their SQL and the rules that read a node's report of one.

- Placing one (activities.JobActivities, in the placement's transaction) writes the
  attempt message into its row (`sent`) and NOTIFYs ATTEMPTS with the node's ID: the edge
  that holds the node's stream reads what waits for it (`waiting_for`) and sends it.
- The node reports its end over whatever stream it has; that edge records the ends of
  many parts in one transaction (`record_ends`, which first checks that each is the node's
  own and still running), acks them, then signals each job's workflow once for all of its
  parts that ended (`parts_ended`) and marks them told (`ends_signalled`).
- The sweeper tells the workflows what an edge could not (`unsignalled_ends`: the signal
  was lost with its server) and the parts whose node no server has heard from for their
  job's lost-after (`silent_parts`): moved as a removed node's are (`node_removed`).

A node's liveness is its row's `last_seen`, which the edges refresh in bulk with their
heartbeats (edge/tracking.py): nothing is written per part while it runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from oz0 import membership
from oz0.jobs import limits as job_limits
from oz0.jobs.end_reasons import EndReason
from oz0.jobs.inputs import UNRECORDED_SCHEMA
from oz0.jobs.spec_text import LOST_AFTER
from oz0.jobs.store import Conn, Job, gone_because, tell_followers
from oz0.jobs.workflow import (
    ATTEMPT_REFUSED,
    NODE_STOPPING,
    RECORD_UNWRITABLE,
    SECRETS_UNREADABLE,
    STOPPED,
    TIMEOUT_MARGIN,
    PartEnd,
)
from oz0.store.events import ATTEMPTS
from oz0_common.attempt_messages import AttemptDone, AttemptResult, EndedBecause, Failure

log = logging.getLogger(__name__)

# A part's end not yet told to its workflow this long after it was recorded: the edge that
# recorded it did not get the signal through (its server died, Temporal was away).
SIGNAL_LATE = dt.timedelta(seconds=2)
MAX_SWEPT = 500


def attempt_message(job: Job, number: int, grant: Mapping[str, str], sealed: str) -> dict[str, Any]:
    """Attempt NUMBER of JOB as its node gets it: the fields an activity's input had
    (docs/node-protocol.md, "Jobs"), which its GRANT signs."""
    attempt: dict[str, Any] = {
        "job_id": job.id,
        "attempt": number,
        "command": job.command,
        "env": job.env,
        "timeout": job.timeout,
        "grant": dict(grant),
    }
    if job.limits:  # only when asked, as the grant signs them
        attempt["limits"] = job.limits
    if job.files:  # the same
        attempt["files"] = job.files
    if sealed:
        attempt["secrets"] = sealed
    return attempt


def take_stream(conn: Conn, node_ids: list[str]) -> set[str]:
    """Those of NODE_IDS whose agent said it takes attempts over its control stream."""
    rows = conn.execute(
        "SELECT id FROM nodes WHERE id = ANY(%s) AND attempts_by_stream", (node_ids,)
    ).fetchall()
    return {str(r[0]) for r in rows}


def set_takes_stream(conn: Conn, node_id: str, takes: bool) -> None:
    """What the node's agent said on its latest stream (an older agent says nothing:
    False); unchanged rows are not written."""
    conn.execute(
        "UPDATE nodes SET attempts_by_stream = %s WHERE id = %s AND attempts_by_stream <> %s",
        (takes, node_id, takes),
    )


def mark_streamed(conn: Conn, job_id: str, sent: list[tuple[int, str, dict[str, Any]]]) -> None:
    """JOB_ID's attempts SENT (number, node, message), just placed, go over their nodes'
    streams as their messages: one statement for all, and one notification a node, which
    the edge holding its stream hears at the commit."""
    if not sent:
        return
    conn.execute(
        "UPDATE job_attempts a SET streamed = true, sent = s.message"
        " FROM unnest(%s::int[], %s::jsonb[]) AS s(number, message)"
        " WHERE a.job_id = %s AND a.number = s.number AND a.state = 'running'",
        ([n for n, _, _ in sent], [Jsonb(m) for _, _, m in sent], job_id),
    )
    conn.execute(
        "SELECT pg_notify(%s, node_id) FROM unnest(%s::text[]) AS u(node_id)",
        (ATTEMPTS, sorted({node for _, node, _ in sent})),
    )


@dataclass(frozen=True)
class Waiting:
    """A streamed attempt its node is to run: the message, and its job's lost-after."""

    job_id: str
    number: int
    message: dict[str, Any]
    lost_after: float


def waiting_for(conn: Conn, node_id: str) -> list[Waiting]:
    """NODE_ID's streamed attempts still running (sent again to a node that has them
    already: it answers so and runs nothing twice)."""
    return waiting_for_many(conn, [node_id])[node_id]


def waiting_for_many(conn: Conn, node_ids: list[str]) -> dict[str, list[Waiting]]:
    """`waiting_for` of each of NODE_IDS, in one statement (an edge whose streams' nodes
    were all placed on at once, a fan-out's, reads them together)."""
    rows = conn.execute(
        "SELECT a.node_id, a.job_id, a.number, a.sent, j.lost_after_s, j.on_lost"
        " FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.node_id = ANY(%s) AND a.state = 'running' AND a.streamed"
        " AND a.sent IS NOT NULL ORDER BY a.started_at, a.job_id, a.number",
        (node_ids,),
    ).fetchall()
    found: dict[str, list[Waiting]] = {node_id: [] for node_id in node_ids}
    for node_id, job_id, number, sent, seconds, on_lost in rows:
        found[str(node_id)].append(
            Waiting(str(job_id), int(number), sent, _lost_after(seconds, on_lost))
        )
    return found


@dataclass(frozen=True)
class WaitingRead:
    """`waiting_for` NODE_ID, as a change of store.batches.Batches (`read_together`)."""

    node_id: str

    def __call__(self, conn: Conn) -> list[Waiting]:
        return waiting_for(conn, self.node_id)


def read_together(conn: Conn, reads: list[Any]) -> list[tuple[Any, BaseException | None]]:
    """Many streams' WaitingReads in one statement."""
    found = waiting_for_many(conn, sorted({read.node_id for read in reads}))
    return [(found[read.node_id], None) for read in reads]


def _lost_after(seconds: float | None, on_lost: str | None) -> float:
    if seconds is not None:
        return float(seconds)
    return LOST_AFTER.get(str(on_lost), LOST_AFTER["move"])


def streamed_numbers(conn: Conn, job_id: str, numbers: list[int]) -> set[int]:
    """Those of JOB_ID's attempts NUMBERS that were placed streamed."""
    rows = conn.execute(
        "SELECT number FROM job_attempts WHERE job_id = %s AND number = ANY(%s) AND streamed",
        (job_id, numbers),
    ).fetchall()
    return {int(r[0]) for r in rows}


def streamed_among(conn: Conn, keys: list[tuple[str, int]]) -> set[tuple[str, int]]:
    """Those of KEYS (job, attempt) that are streamed."""
    rows = conn.execute(
        "SELECT a.job_id, a.number FROM unnest(%s::text[], %s::int[]) AS w(job_id, number)"
        " JOIN job_attempts a ON a.job_id = w.job_id AND a.number = w.number WHERE a.streamed",
        ([k[0] for k in keys], [k[1] for k in keys]),
    ).fetchall()
    return {(str(r[0]), int(r[1])) for r in rows}


# --- a node's report of a part's end --------------------------------------------------


@dataclass(frozen=True)
class Report:
    """What a node said of its streamed attempt: exactly one of RESULT, FAILURE or
    CANCELLED, as in its `attempt_done` (oz0_common/attempt_messages.py), or what the edge
    says for it (a part the node did not take)."""

    node_id: str
    job_id: str
    number: int
    result: AttemptResult | None = None
    failure: Failure | None = None
    cancelled: bool = False

    @classmethod
    def of(cls, node_id: str, done: AttemptDone) -> Report:
        return cls(node_id, done.job, done.number, done.result, done.failure, done.cancelled)

    def __call__(self, conn: Conn) -> Recorded:
        """This report written alone (a batch of reports is written by `record_ends`)."""
        [recorded] = record_ends(conn, [self])
        return recorded


def part_end(
    report: Report, gone: EndReason, unrecorded: bool = False
) -> tuple[PartEnd, dict[str, Any] | None]:
    """The part's end as its workflow reads it, and what the node said it applied, by the
    same rules as an activity's end (workflow._attempts.attempt_ends): a result is its exit
    (or timeout); the node's refusal fails the job; secrets it could not read move the part;
    so does an attempt it could not record as run (its disk full), said so if every
    server up knows that reason (UNRECORDED); anything else the node says went wrong is
    its node's fault, the part moved: GONE, what became of the node as `gone_because`
    reads it at the write (NODE_LOST while it is still accepted)."""
    number = report.number
    if report.result is not None:
        result = report.result
        because = EndReason.TIMEOUT if result.timed_out else EndReason.EXIT
        return PartEnd(number, because, result.exit_code), result.applied
    if report.cancelled:
        return PartEnd(number, EndReason.CANCELLED), None
    assert report.failure is not None
    kind, message = report.failure.type, report.failure.message
    if kind == ATTEMPT_REFUSED:
        refusal = f"node {report.node_id} refused attempt {number}: {message}"
        return PartEnd(number, EndReason.REFUSED, refusal=refusal), None
    if kind == SECRETS_UNREADABLE:
        return PartEnd(number, EndReason.NODE_COULD_NOT_READ_SECRETS), None
    if kind == RECORD_UNWRITABLE and unrecorded:
        return PartEnd(number, EndReason.NODE_COULD_NOT_RECORD), None
    return PartEnd(number, gone, lost=STOPPED if kind == NODE_STOPPING else None), None


# What record_ends says of each report: stored; not the node's or not running; or the
# node's running attempt, but an activity (its end is its activity's to take).
STORED, ENDED, NOT_STREAMED = "stored", "ended", "not streamed"


@dataclass(frozen=True)
class Recorded:
    """A report's fate: STORED with the end its workflow is told (and its tenant), ENDED
    (not this node's, or ended already: nothing to do), or NOT_STREAMED."""

    answer: str
    job_id: str | None = None
    tenant: str | None = None
    end: PartEnd | None = None


def output_cut(report: Report) -> bool:
    """Whether the node says it kept less output than the command printed: past the cap,
    or its disk full (the supervisor could not write it, nor the mark that would have told
    the stream), or dropped by the agent. Without this the attempt showed its output whole:
    bench.soak found an attempt ended `exit` with 0 of the 104 bytes its command printed,
    on the node whose disk was full."""
    result = report.result
    return result is not None and (result.truncated or not result.output_complete)


def record_ends(conn: Conn, reports: list[Report]) -> list[Recorded]:
    """Each of REPORTS recorded as its part's end, if it is its node's streamed attempt and
    still running; in one transaction, the rows locked in key order (two edges writing
    the same parts cannot cross)."""
    order = sorted(range(len(reports)), key=lambda i: (reports[i].job_id, reports[i].number))
    rows = {
        (str(r[0]), int(r[1])): r[2:]
        for r in conn.execute(
            "SELECT a.job_id, a.number, a.node_id, a.state, a.streamed, j.tenant, n.state"
            " FROM unnest(%s::text[], %s::int[]) AS w(job_id, number)"
            " JOIN job_attempts a ON a.job_id = w.job_id AND a.number = w.number"
            " JOIN jobs j ON j.id = a.job_id LEFT JOIN nodes n ON n.id = a.node_id"
            " ORDER BY a.job_id, a.number FOR UPDATE OF a",
            ([reports[i].job_id for i in order], [reports[i].number for i in order]),
        ).fetchall()
    }
    out: list[Recorded] = []
    told: set[str] = set()
    # Whether the workers of every server up read NODE_COULD_NOT_RECORD (in the row's
    # part_end, the signal): asked only when a node says so, rarely.
    unrecorded = any(
        r.failure is not None and r.failure.type == RECORD_UNWRITABLE for r in reports
    ) and membership.all_up_at_least(conn, UNRECORDED_SCHEMA)
    for report in reports:
        row = rows.get((report.job_id, report.number))
        if row is None:
            out.append(Recorded(ENDED))
            continue
        node_id, state, streamed, tenant, node_state = row
        if node_id != report.node_id or state != "running":
            out.append(Recorded(ENDED))
            continue
        if not streamed:
            out.append(Recorded(NOT_STREAMED))
            continue
        end, applied = part_end(report, gone_because(node_state), unrecorded)
        kept = job_limits.applied_from_node(applied)
        detail = report.failure.message if report.failure is not None else None
        conn.execute(
            "UPDATE job_attempts SET state = 'ended', ended_at = now(), ended_because = %s,"
            " exit_code = %s, applied = %s, part_end = %s, sent = sent - 'secrets',"
            " truncated = truncated OR %s, ended_detail = %s WHERE job_id = %s AND number = %s",
            (
                end.because, end.exit_code, None if kept is None else Jsonb(kept),
                Jsonb(dataclasses.asdict(end)), output_cut(report), detail or None,
                report.job_id, report.number,
            ),
        )  # fmt: skip
        rows[(report.job_id, report.number)] = (node_id, "ended", streamed, tenant, node_state)
        if report.job_id not in told:
            told.add(report.job_id)
            tell_followers(conn, report.job_id)
        out.append(Recorded(STORED, report.job_id, str(tenant), end))
    return out


def ends_signalled(conn: Conn, keys: list[tuple[str, int]]) -> None:
    """The workflows of KEYS (job, attempt) were told of those ends."""
    if keys:
        conn.execute(
            "UPDATE job_attempts SET end_signalled = true FROM unnest(%s::text[], %s::int[])"
            " AS w(job_id, number) WHERE job_attempts.job_id = w.job_id"
            " AND job_attempts.number = w.number AND NOT end_signalled",
            ([k[0] for k in keys], [k[1] for k in keys]),
        )


@dataclass(frozen=True)
class Untold:
    """A job's streamed parts that ended without their workflow hearing of it."""

    tenant: str
    job_id: str
    ends: list[PartEnd]


def unsignalled_ends(conn: Conn) -> list[Untold]:
    """Parts whose end was recorded more than SIGNAL_LATE ago and not yet told, grouped by
    job (a workflow that has ended meanwhile answers NOT_FOUND: told, as far as it goes)."""
    rows = conn.execute(
        "SELECT a.job_id, j.tenant, a.part_end FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.streamed AND a.state = 'ended' AND NOT a.end_signalled AND j.workflow_started"
        " AND a.part_end IS NOT NULL AND a.ended_at < now() - %s"
        " ORDER BY a.job_id, a.number LIMIT %s",
        (SIGNAL_LATE, MAX_SWEPT),
    ).fetchall()
    return _by_job(
        (str(job_id), str(tenant), PartEnd(**{**end, "because": EndReason(end["because"])}))
        for job_id, tenant, end in rows
    )


def _by_job(ends: Iterable[tuple[str, str, PartEnd]]) -> list[Untold]:
    """ENDS (job, tenant, end) grouped by job, in the order each job first comes."""
    grouped: dict[str, Untold] = {}
    for job_id, tenant, end in ends:
        grouped.setdefault(job_id, Untold(tenant, job_id, [])).ends.append(end)
    return list(grouped.values())


def silent_parts(conn: Conn) -> list[tuple[str, str, int]]:
    """(job, tenant, attempt) of the streamed parts still running whose node no server
    has heard from for their job's lost-after (its stream gone, or its server dead), not
    yet told to their workflow (`removal_signalled`, as a removed node's)."""
    rows = conn.execute(
        "SELECT a.job_id, j.tenant, a.number FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
        " JOIN nodes n ON n.id = a.node_id LEFT JOIN servers s ON s.id = n.server"
        " WHERE a.streamed AND a.state = 'running' AND NOT a.removal_signalled"
        " AND n.state = 'accepted'"
        " AND a.started_at < now() - make_interval(secs => coalesce(j.lost_after_s,"
        "  CASE j.on_lost WHEN 'wait' THEN %(wait)s ELSE %(move)s END))"
        " AND coalesce(least(n.last_seen, CASE WHEN n.server IS NULL THEN n.last_seen"
        "  ELSE s.last_heartbeat END), '-infinity') < now() - make_interval(secs =>"
        "  coalesce(j.lost_after_s, CASE j.on_lost WHEN 'wait' THEN %(wait)s ELSE %(move)s END))"
        " LIMIT %(limit)s",
        {"wait": LOST_AFTER["wait"], "move": LOST_AFTER["move"], "limit": MAX_SWEPT},
    ).fetchall()
    return [(str(r[0]), str(r[1]), int(r[2])) for r in rows]


def overdue_parts(conn: Conn) -> list[Report]:
    """The streamed parts still running TIMEOUT_MARGIN past their job's timeout, as reports
    of a timeout in their node's name: the node ends a part at its timeout and says so, so
    one this late has a node that cannot (its supervisor wedged, its reports lost while
    its stream lives). An activity's start-to-close (the timeout and TIMEOUT_MARGIN) ended
    it so before parts were rows; `record_ends` writes them as it would the node's word."""
    rows = conn.execute(
        "SELECT a.node_id, a.job_id, a.number FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
        " WHERE a.streamed AND a.state = 'running' AND j.timeout_s IS NOT NULL"
        " AND a.started_at < now() - make_interval(secs => j.timeout_s + %s)"
        " ORDER BY a.job_id, a.number LIMIT %s",
        (TIMEOUT_MARGIN.total_seconds(), MAX_SWEPT),
    ).fetchall()
    timed_out = AttemptResult(None, ended_because=EndedBecause.TIMEOUT)
    return [Report(str(r[0]), str(r[1]), int(r[2]), result=timed_out) for r in rows]


def end_overdue(conn: Conn, reports: list[Report]) -> list[Untold]:
    """REPORTS (`overdue_parts`) written as their parts' ends, grouped by job to be told:
    a part that ended meanwhile is left as it ended."""
    stored = []
    for report, recorded in zip(reports, record_ends(conn, reports), strict=True):
        if recorded.answer != STORED or recorded.end is None:
            continue
        log.warning(
            "job %s: attempt %d on node %s ran past its timeout without a word of its end;"
            " ended as timed out", report.job_id, report.number, report.node_id,
        )  # fmt: skip
        stored.append((report.job_id, str(recorded.tenant), recorded.end))
    return _by_job(stored)
