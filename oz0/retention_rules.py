"""How long history is kept, and how many jobs a tenant may have queued: the bounds, and
durations as operators type them (`12h`, `30d`).

Pure rules, apart from `oz0.tenants` and the pruner, so that the command line can check
what an operator typed without loading psycopg and the rest of the server.
"""

from __future__ import annotations

import re

from oz0.errors import Oz0Error

HOUR, DAY = 3600, 86400
# A tenant's finished jobs are kept this long after they end (`tenant set --job-retention`).
JOB_RETENTION_DEFAULT = 30 * DAY
# Under an hour, an operator could lose a job's output before reading it; ten years is
# "for ever" for a job table (and fits Temporal's retention, a duration in seconds).
JOB_RETENTION_MIN, JOB_RETENTION_MAX = HOUR, 3650 * DAY
# The audit log's retention (`cluster set --audit-retention`): none (kept for ever) by
# default; when set, a day at least, so a change is seen by whoever reads the log daily.
AUDIT_RETENTION_MIN, AUDIT_RETENTION_MAX = DAY, 3650 * DAY
KEEP = "keep"
# Jobs one tenant may have queued (waiting for a node) at once (`--max-queued-jobs`).
MAX_QUEUED_DEFAULT = 10_000
MAX_QUEUED_MIN, MAX_QUEUED_MAX = 1, 1_000_000

_PARTS = re.compile(r"(?:(?P<d>\d+)d)?(?:(?P<h>\d+)h)?(?:(?P<m>\d+)m)?(?:(?P<s>\d+)s)?")
_UNIT = {"d": DAY, "h": HOUR, "m": 60, "s": 1}


class RetentionError(Oz0Error):
    """A retention or cap out of its bounds, or not a duration: the message says which."""


def parse_duration(text: str) -> int:
    """Whole seconds in TEXT: `30d`, `12h`, `1d12h`, `90m`, `3600s` or `3600`."""
    cleaned = text.strip()
    if cleaned.isdigit():
        return int(cleaned)
    match = _PARTS.fullmatch(cleaned)
    if not cleaned or match is None:
        raise RetentionError(
            f"invalid duration {text!r}: use a number with d, h, m or s, such as 30d, 12h or 1d12h"
        )
    return sum(int(n) * _UNIT[unit] for unit, n in match.groupdict().items() if n)


def describe(seconds: int | None) -> str:
    """SECONDS as an operator would type it (`30d`, `1d12h`); None: `keep` (for ever)."""
    if seconds is None:
        return KEEP
    parts, rest = [], seconds
    for unit, size in _UNIT.items():
        if rest >= size:
            parts.append(f"{rest // size}{unit}")
            rest %= size
    return "".join(parts) or "0s"


def _within(what: str, seconds: int, low: int, high: int) -> int:
    if not low <= seconds <= high:
        raise RetentionError(
            f"{what} must be from {describe(low)} to {describe(high)}, not {describe(seconds)}"
        )
    return seconds


def job_retention(value: str | int) -> int:
    """A tenant's job retention in seconds, from what an operator typed or the API sent."""
    seconds = parse_duration(value) if isinstance(value, str) else value
    return _within("job retention", seconds, JOB_RETENTION_MIN, JOB_RETENTION_MAX)


def audit_retention(value: str | int | None) -> int | None:
    """The audit log's retention in seconds; None (`keep`): for ever."""
    if value is None or value == KEEP:
        return None
    try:
        seconds = parse_duration(value) if isinstance(value, str) else value
    except RetentionError as e:
        raise RetentionError(f"{e}; or {KEEP} (for ever)") from None
    return _within("audit retention", seconds, AUDIT_RETENTION_MIN, AUDIT_RETENTION_MAX)


def max_queued(value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RetentionError("max queued jobs must be a whole number")
    if not MAX_QUEUED_MIN <= value <= MAX_QUEUED_MAX:
        raise RetentionError(
            f"max queued jobs must be from {MAX_QUEUED_MIN} to {MAX_QUEUED_MAX}, not {value}"
        )
    return value
