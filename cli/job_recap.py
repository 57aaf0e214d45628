"""Where a job's parts are, as `job run` shows it: the one live line while it runs (as Salt's
`--progress`) and the recap at its end (as Ansible's PLAY RECAP and Salt's `--summary`),
in text for people and as data for `--json`.

Pure: everything is read from the job object each output page carries (its attempts, and
for an `--all` job its `parts` counts), so it is tested with recorded jobs.

A part is one node's share of the job (an `--all` job has one per node; any other job has
one, which may move from node to node). Where it is comes from its last attempt.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, TypedDict

from cli.output import terminal_safe
from oz0.jobs.end_reasons import EndReason

# Where a part is. The first seven are ends; a part whose node was taken away (blocked,
# purged, deleted, lost: the reasons an attempt of another job would move for) is LOST.
OK, FAILED, TIMEOUT, CANCELLED, REFUSED, LOST, NOT_STARTED = (
    "ok", "failed", "timeout", "cancelled", "refused", "lost", "not_started",
)  # fmt: skip
RUNNING, WAITING = "running", "waiting"
OUTCOMES = (OK, FAILED, TIMEOUT, CANCELLED, REFUSED, LOST, NOT_STARTED, RUNNING, WAITING)
# Ended otherwise than well, and not for its node: what the live line counts as failed.
_FAILED_LIKE = (FAILED, TIMEOUT, CANCELLED, REFUSED)
# The recap lists at most this many parts that did not end well; `job show` has them all.
MAX_LISTED = 50


@dataclass(frozen=True)
class PartView:
    """One part as its last attempt leaves it (attempt None: it has none yet). In `--json`,
    an object of these fields in this order (asdict)."""

    part: int
    node: str | None
    outcome: str
    exit_code: int | None
    reason: str | None
    attempts: int


class RecapJson(TypedDict):
    """`job run --json`'s answer once the job has ended."""

    job: str
    state: str | None
    reason: str | None
    exit_code: int | None
    seconds: float | None
    nodes: int
    outcomes: dict[str, int]
    exit_codes: dict[str, int]
    parts: list[dict[str, Any]]  # each a PartView's fields


def attempt_outcome(attempt: dict[str, Any]) -> str:
    """Where an attempt left its part: RUNNING, or how it ended."""
    if attempt.get("state") != "ended":
        return RUNNING
    because = attempt.get("ended_because")
    if because == EndReason.EXIT:
        return OK if attempt.get("exit_code") == 0 else FAILED
    if because in (EndReason.TIMEOUT, EndReason.CANCELLED, EndReason.REFUSED):
        return str(because)
    try:
        return LOST if EndReason(str(because)).moves else FAILED
    except ValueError:  # a reason this command line does not know (a newer server)
        return FAILED


def describe(attempt: dict[str, Any]) -> str:
    """How an attempt ended, in a few words: `exit code 3`, `timeout`, `node lost: ...`."""
    outcome = attempt_outcome(attempt)
    if outcome == RUNNING:
        return "running"
    because = attempt.get("ended_because")
    if because == EndReason.EXIT:
        return f"exit code {attempt.get('exit_code')}"
    text = str(because or "ended")
    detail = attempt.get("ended_detail")  # the node's words on why (a server older: none)
    return f"{text}: {detail}" if detail else text


def parts_of(job: dict[str, Any]) -> list[PartView]:
    """Every part that has an attempt, by part number, as its last attempt leaves it."""
    last: dict[int, dict[str, Any]] = {}
    tries: Counter[int] = Counter()
    for attempt in job.get("attempts") or []:
        # A server older than parts numbers none: every attempt of a job on one node is
        # its one part's, and an `--all` job's attempt N is part N - 1.
        part = attempt.get("part")
        if not isinstance(part, int):
            part = int(attempt.get("number", 1)) - 1 if job.get("all") else 0
        tries[part] += 1
        if part not in last or int(attempt.get("number", 0)) > int(last[part].get("number", 0)):
            last[part] = attempt
    views = []
    for part, attempt in sorted(last.items()):
        outcome = attempt_outcome(attempt)
        code = attempt.get("exit_code") if attempt.get("ended_because") == EndReason.EXIT else None
        reason = None if outcome in (OK, RUNNING) else describe(attempt)
        node = attempt.get("node")
        views.append(
            PartView(part, None if node is None else str(node), outcome, code, reason, tries[part])
        )
    return views


@dataclass(frozen=True)
class Tally:
    """How many parts are where, of TOTAL."""

    total: int
    counts: dict[str, int]

    def __getitem__(self, outcome: str) -> int:
        return self.counts.get(outcome, 0)

    @property
    def failed_like(self) -> int:
        return sum(self[o] for o in _FAILED_LIKE)


def tally(job: dict[str, Any], views: list[PartView] | None = None) -> Tally:
    """Where JOB's parts are. An `--all` job's `parts` gives its total and the parts
    without an attempt (waiting for their turn in a rolling batch, or never started); a
    job on one node has one part, waiting until it has an attempt."""
    views = parts_of(job) if views is None else views
    counts = Counter(v.outcome for v in views)
    parts = job.get("parts")
    if isinstance(parts, dict):
        counts[NOT_STARTED] += int(parts.get("not_started") or 0)
        counts[WAITING] += int(parts.get("waiting") or 0)
        total = max(int(parts.get("total") or 0), sum(counts.values()))
    elif job.get("all"):
        total = len(views)  # a server older than parts: the attempts are all there is
    else:
        total = 1
        if not views:
            ended = job.get("state") in ("succeeded", "failed", "cancelled", "lost")
            counts[NOT_STARTED if ended else WAITING] += 1
    return Tally(total, dict(counts))


def progress_line(job_id: str, counts: Tally) -> str:
    """The live line: `job-...: 12 ok, 2 failed, 3 running, 3 waiting of 20` (lost and not
    started only when there are some)."""
    if counts.total == 0:
        return terminal_safe(f"{job_id}: waiting for nodes")
    words = [f"{counts[OK]} ok", f"{counts.failed_like} failed"]
    if counts[LOST]:
        words.append(f"{counts[LOST]} lost")
    if counts[NOT_STARTED]:
        words.append(f"{counts[NOT_STARTED]} not started")
    words += [f"{counts[RUNNING]} running", f"{counts[WAITING]} waiting of {counts.total}"]
    return terminal_safe(f"{job_id}: " + ", ".join(words))


def seconds_of(job: dict[str, Any]) -> float | None:
    """How long the job ran, by the servers' clock (None: it never started or has not
    ended)."""
    started, ended = job.get("started_at"), job.get("ended_at")
    if not isinstance(started, str) or not isinstance(ended, str):
        return None
    try:
        took = dt.datetime.fromisoformat(ended) - dt.datetime.fromisoformat(started)
    except ValueError:
        return None
    return round(max(took.total_seconds(), 0.0), 3)


def recap_json(job: dict[str, Any]) -> RecapJson:
    return _recap(job, parts_of(job))


def _recap(job: dict[str, Any], views: list[PartView]) -> RecapJson:
    counts = tally(job, views)
    codes = Counter(v.exit_code for v in views if v.exit_code is not None)
    return {
        "job": str(job.get("id")),
        "state": job.get("state"),
        "reason": job.get("reason"),
        "exit_code": job.get("exit_code"),
        "seconds": seconds_of(job),
        "nodes": counts.total,
        "outcomes": {o: counts[o] for o in OUTCOMES},
        "exit_codes": {str(code): n for code, n in sorted(codes.items())},
        "parts": [asdict(v) for v in views],
    }


# The order the recap lists parts that did not end well in: the worst news first.
_LISTED = (LOST, FAILED, TIMEOUT, REFUSED, CANCELLED, RUNNING)


def recap_lines(job: dict[str, Any]) -> list[str]:
    """The recap for people, every line made safe for a terminal:

    RECAP job-0123456789ab: failed in 12.3 s on 20 nodes
      ok=17  failed=2  lost=1
      exit codes: 0=17  1=1  3=1
      node-00000000000a  failed  exit code 3
      node-00000000000c  lost    node lost
    """
    views = parts_of(job)
    recap = _recap(job, views)
    took = "" if recap["seconds"] is None else f" in {recap['seconds']:g} s"
    nodes = recap["nodes"]
    lines = [f"RECAP {recap['job']}: {recap['state']}{took} on {nodes} node{_s(nodes)}"]
    outcomes = recap["outcomes"]
    shown = [o for o in OUTCOMES if o in (OK, FAILED, LOST) or outcomes[o]]
    lines.append("  " + "  ".join(f"{o}={outcomes[o]}" for o in shown))
    if recap["exit_codes"]:
        lines.append(
            "  exit codes: " + "  ".join(f"{c}={n}" for c, n in recap["exit_codes"].items())
        )
    bad = sorted(
        (v for v in views if v.outcome in _LISTED),
        key=lambda v: (_LISTED.index(v.outcome), str(v.node)),
    )
    width = max((len(v.outcome) for v in bad), default=0)
    for v in bad[:MAX_LISTED]:
        lines.append(f"  {v.node}  {v.outcome:<{width}}  {v.reason or ''}".rstrip())
    if len(bad) > MAX_LISTED:
        lines.append(
            f"  ... and {len(bad) - MAX_LISTED} more: orchestrator-zero job show {recap['job']}"
        )
    return [terminal_safe(line) for line in lines]


def _s(n: int) -> str:
    return "" if n == 1 else "s"
