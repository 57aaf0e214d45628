"""The soak's checker (issue 44): the ledger (what ran on the nodes, bench/soak_ledger.py)
and what the soak saw from outside, against the cluster's own records. Pure: it reads
values the soak collected, so that each kind of violation is tested on hand-made ledgers
and records (tests/test_soak_check.py).

The kinds (CHECKS, at the end), each with what it compares:
- `not_terminal`: a job not ended when the check ran, past its bound (the workload's
  worst case for it: queue timeout, every attempt's length, moves).
- `ran_twice`: a (job, attempt) with more than one `start` in the ledger.
- `unlisted_run`: a run in the ledger that the job does not list as an attempt on that
  node (or whose job the cluster does not know); a session's run (its job the session's
  ID, attempt 1) that the cluster lists as no session on that node.
- `false_success`: a job `succeeded` one of whose parts' last attempt did not end 0 in the
  ledger (no `end`, or another status); also any attempt the cluster says exited with a
  code other than the ledger's.
- `output_differs`: an attempt the cluster says ended `exit` (it claims the command's whole
  run) and the ledger saw end, whose stored stdout (not truncated) has another SHA-256
  than the ledger's digest, or none. An attempt ended another way (its node blocked or
  lost, a timeout, a cancel) keeps what came before its end: at-least-once, its job moved
  on or ended without it. Also a run that ended 0 of a job whose output is known
  beforehand (`job run --file`: the SHA-256 of the file placed) and printed other than it.
- `file_differs`: a node whose agent reported a push `written` or `unchanged`, whose file
  (read by the soak from the node's disk after the push ended) is missing or has another
  SHA-256 than the content pushed. A push's job runs no command: the ledger checks above
  leave it out.
- `session_lost`: a session whose recording (read through the API) is not what ran: it
  lacks output the soak was shown over the session's websocket (output is recorded
  before it is shown), or the session ended by its command's exit (as the cluster
  records it) and the output recorded has another SHA-256 than the ledger's digest of
  what the command printed. A session refused or broken by a fault is no violation.
- `audit_missing`: a change the workload made (and the API accepted) with no audit row.
- `slow_block`: a block whose effect on a connected node, seen from the node's side, came
  more than BLOCK_BOUND after the API's answer (the block committed: docs/manage-nodes.md
  promises two seconds from there, on every server), or never: the latest of its stream
  refused `blocked` and each server's Temporal refusing the node's own calls
  (bench/soak_probe.py). The request's own time is reported beside it, not judged; so is
  a block of a node not connected then, or whose stream was on a server a fault had
  stopped or paused (no server can end it before the node is on another); and so is the
  Temporal of a server a fault stopped, paused or whose host it killed meanwhile, or that
  the probe could not reach before it refused (its host still restarting after a kill).
- `unplanned_exit`: a server that exited when no fault asked it to, or a server's Temporal
  host (a child of the server, which starts another) that exited with no
  `temporal_host_kill` of that server nor a stop of the server itself (planned or not)
  within EXIT_SLACK of it.
- `rss_growth`: a server's or agent's resident memory grew more than RSS_GROWTH from the
  reference (the tenth minute of an hour: a sixth of the run) to the end. A short run
  scales it: the reference is the median of the samples in [run/6, run/6 + run/12], the
  end the median of the last run/12 (a single sample is noise), and a process is judged
  only if it lived, the same PID, from before the reference to the end (a restarted
  process starts afresh).
- `db_connections`: the cluster's database connections past their bound.
"""

from __future__ import annotations

import hashlib
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from bench.soak_model import (
    AttemptRecord,
    HostExit,
    JobRecord,
    Records,
    Run,
    Sample,
    Violation,
)

ENDED = ("succeeded", "failed", "cancelled", "lost")
BLOCK_BOUND = 2.0
RSS_GROWTH = 0.20
# A host exit is explained by a fault on its server this long (minutes) before or after:
# the watch sees an exit within its poll, a stop's span ends once the server is back.
EXIT_SLACK = 10.0 / 60.0
# The faults that end a server's Temporal host (a server stopped takes its host with it).
HOST_ENDING = ("temporal_host_kill", "server_kill", "server_term")


def check(records: Records) -> list[Violation]:
    """Every violation, kind by kind in the order of CHECKS."""
    return [violation for find in CHECKS.values() for violation in find(records)]


def _minute(records: Records, at: float) -> float:
    return (at - records.started_at) / 60.0


def not_terminal(records: Records) -> Iterable[Violation]:
    for job in records.jobs:
        if job.state not in ENDED and records.checked_at > job.bound:
            yield Violation(
                "not_terminal",
                job.minute,
                f"{job.id} still {job.state} {records.checked_at - job.bound:.0f} s past its bound",
            )


def ran_twice(records: Records) -> Iterable[Violation]:
    starts: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for run in records.runs:
        starts[(run.job, run.attempt)].append(run)
    for (job, attempt), runs in starts.items():
        if len(runs) > 1:
            where = ", ".join(f"{r.node} pid {r.pid}" for r in runs)
            yield Violation(
                "ran_twice",
                _minute(records, runs[1].start),
                f"{job} attempt {attempt} started {len(runs)} times: {where}",
            )


def unlisted_runs(records: Records) -> Iterable[Violation]:
    jobs = {job.id: job for job in records.jobs}
    sessions = {s.id: s.node for s in records.sessions}
    for run in records.runs:
        job = jobs.get(run.job)
        listed = job is not None and any(
            a.number == run.attempt and a.node == run.node for a in job.attempts
        )
        # A session's command runs as attempt 1 of a job named by the session's ID.
        if run.job in sessions:
            listed = sessions[run.job] == run.node and run.attempt == 1
            job = JobRecord(run.job, "session", 0.0)
        if not listed:
            which = "the cluster does not know" if job is None else "it does not list"
            yield Violation(
                "unlisted_run",
                _minute(records, run.start),
                f"{run.job} attempt {run.attempt} ran on {run.node} (pid {run.pid}), which {which}",
            )


def false_successes(records: Records) -> Iterable[Violation]:
    ran: dict[tuple[str, int], Run] = {}
    for each in records.runs:
        ran.setdefault((each.job, each.attempt), each)
    for job in records.jobs:
        if not job.ledgered:
            continue
        last: dict[int, AttemptRecord] = {}
        for attempt in sorted(job.attempts, key=lambda a: a.number):
            last[attempt.part] = attempt
            seen = ran.get((job.id, attempt.number))
            if (
                attempt.ended_because == "exit"
                and seen is not None
                and seen.status is not None
                and attempt.exit_code != seen.status
            ):
                yield Violation(
                    "false_success",
                    job.minute,
                    f"{job.id} attempt {attempt.number}: the cluster says exit"
                    f" {attempt.exit_code}, the ledger {seen.status}",
                )
        if job.state != "succeeded":
            continue
        for attempt in last.values():
            run = ran.get((job.id, attempt.number))
            if run is None or run.status != 0:
                said = "no run" if run is None else f"exit {run.status}"
                said = "a run that never ended" if run and run.status is None else said
                yield Violation(
                    "false_success",
                    job.minute,
                    f"{job.id} succeeded but its attempt {attempt.number} on {attempt.node}"
                    f" has {said} in the ledger",
                )


def outputs_differ(records: Records) -> Iterable[Violation]:
    ended = {(r.job, r.attempt): r for r in records.runs if r.digest is not None}
    for job in records.jobs:
        for given in (r for r in records.runs if r.job == job.id) if job.expect else ():
            if given.status == 0 and given.digest not in (None, job.expect):
                yield Violation(
                    "output_differs",
                    job.minute,
                    f"{job.id} attempt {given.attempt} on {given.node} printed {given.size}"
                    " bytes other than the SHA-256 of the file it was given",
                )
        for attempt in job.attempts:
            run = ended.get((job.id, attempt.number))
            if run is None or attempt.truncated or attempt.ended_because != "exit":
                continue
            if attempt.stdout_sha256 != run.digest:
                yield Violation(
                    "output_differs",
                    job.minute,
                    f"{job.id} attempt {attempt.number} on {attempt.node}: {attempt.stdout_bytes}"
                    f" bytes of stdout stored, other than the {run.size} bytes the command"
                    " printed",
                )


def files_differ(records: Records) -> Iterable[Violation]:
    for push in records.pushes:
        for node in push.nodes:
            if node.result in ("written", "unchanged") and node.found != push.sha256:
                found = "no file" if node.found is None else f"a file of SHA-256 {node.found}"
                yield Violation(
                    "file_differs",
                    push.minute,
                    f"{push.job} attempt {node.attempt} on {node.node}: reported"
                    f" {node.result}, {found} there, not {push.sha256}",
                )


def sessions_lost(records: Records) -> Iterable[Violation]:
    ended = {r.job: r for r in records.runs if r.digest is not None}
    for session in records.sessions:
        recorded = session.recorded
        if recorded is None:
            continue
        if not recorded.startswith(session.received):
            yield Violation(
                "session_lost",
                session.minute,
                f"{session.id} on {session.node}: {len(session.received)} bytes shown, the"
                f" recording's {len(recorded)} bytes of output do not begin with them",
            )
            continue
        run = ended.get(session.id)
        if session.live or session.exit_code is None or run is None:
            continue
        if hashlib.sha256(recorded).hexdigest() != run.digest:
            yield Violation(
                "session_lost",
                session.minute,
                f"{session.id} on {session.node} ended exit {session.exit_code}: its"
                f" recording has {len(recorded)} bytes of output, the command printed"
                f" {run.size}",
            )


def audit_missing(records: Records) -> Iterable[Violation]:
    for change in records.changes:
        if (change.action, change.target) not in records.audit:
            yield Violation(
                "audit_missing",
                change.minute,
                f"no audit row {change.action} {change.target}",
            )


def slow_blocks(records: Records) -> Iterable[Violation]:
    for probe in records.blocks:
        effect = probe.effect
        if probe.exempt is None and (effect is None or effect > BLOCK_BOUND):
            took = "never" if effect is None else f"after {effect:.2f} s"
            yield Violation(
                "slow_block",
                probe.minute,
                f"block of {probe.node} took effect {took} ({probe.late()})",
            )


def unplanned_exits(records: Records) -> Iterable[Violation]:
    for exit_ in records.exits:
        if not exit_.planned:
            code = "unknown" if exit_.code is None else exit_.code
            yield Violation("unplanned_exit", exit_.minute, f"{exit_.name} exited (code {code})")
    for host in records.host_exits:
        if not _host_exit_explained(records, host):
            yield Violation(
                "unplanned_exit",
                host.minute,
                f"the Temporal host of server {host.server} (pid {host.pid}) exited, with"
                " no fault on it or its server",
            )


def _host_exit_explained(records: Records, host: HostExit) -> bool:
    """Whether a fault that ends hosts hit HOST's server about then, or its server exited
    (an unplanned server exit is its own violation)."""
    near = (host.minute - EXIT_SLACK, host.minute + EXIT_SLACK)
    if any(
        span.target == host.server and span.kind in HOST_ENDING
        and span.start <= near[1] and span.end >= near[0]
        for span in records.faults
    ):  # fmt: skip
        return True
    return any(
        e.name == f"server {host.server}" and near[0] <= e.minute <= near[1] for e in records.exits
    )


@dataclass(frozen=True)
class RssChange:
    """A process's resident memory at the reference minute and at the end (medians of the
    samples in each window), for one that lived, as the same process, through both."""

    name: str
    pid: int
    reference: float
    before: float
    after: float

    @property
    def growth(self) -> float:
        return self.after / self.before - 1


def rss_changes(records: Records) -> list[RssChange]:
    """Each process's memory from the tenth minute of an hour (a sixth of the run) to the
    end: the windows a twelfth of the run long."""
    if records.minutes <= 0:
        return []
    reference = records.minutes / 6
    window = records.minutes / 12
    series: dict[tuple[str, int], list[Sample]] = defaultdict(list)
    for sample in records.rss:
        series[(sample.name, sample.pid)].append(sample)
    changes = []
    for (name, pid), samples in series.items():
        if samples[0].minute > reference or samples[-1].minute < records.minutes - window:
            continue  # not alive, the same process, from the reference to the end
        at_ref = [s.rss_mib for s in samples if reference <= s.minute <= reference + window]
        at_end = [s.rss_mib for s in samples if s.minute >= records.minutes - window]
        if at_ref and at_end:
            before, after = statistics.median(at_ref), statistics.median(at_end)
            changes.append(RssChange(name, pid, reference, before, after))
    return changes


def rss_growth(records: Records) -> Iterable[Violation]:
    for change in rss_changes(records):
        if change.growth > RSS_GROWTH:
            yield Violation(
                "rss_growth",
                records.minutes,
                f"{change.name} (pid {change.pid}) grew from {change.before:.1f} MiB (minute"
                f" {change.reference:.1f}) to {change.after:.1f} MiB"
                f" (+{100 * change.growth:.0f} %)",
            )


def db_connections(records: Records) -> Iterable[Violation]:
    over = [(m, n) for m, n in records.connections if n > records.connection_bound]
    if over:
        minute, most = max(over, key=lambda o: o[1])
        yield Violation(
            "db_connections",
            minute,
            f"{most} database connections, bound {records.connection_bound}"
            f" ({len(over)} readings over it)",
        )


# Each kind of violation and what finds it, in the order `check` gives them.
CHECKS: dict[str, Callable[[Records], Iterable[Violation]]] = {
    "not_terminal": not_terminal,
    "ran_twice": ran_twice,
    "unlisted_run": unlisted_runs,
    "false_success": false_successes,
    "output_differs": outputs_differ,
    "file_differs": files_differ,
    "session_lost": sessions_lost,
    "audit_missing": audit_missing,
    "slow_block": slow_blocks,
    "unplanned_exit": unplanned_exits,
    "rss_growth": rss_growth,
    "db_connections": db_connections,
}
