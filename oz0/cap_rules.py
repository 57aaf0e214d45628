"""Caps on what one person or one tenant may hold or ask for, so that no one of them takes
a server's database pool, its live-update slots or Temporal's schedules from the others:
their defaults, bounds and flags, and the one line a request past one is refused with.

Two kinds. A person's, per server (`server start` flags, defaults in oz0/server_defaults.py,
enforced by oz0/server/person_limits.py): web sessions, live pages, event streams, requests
a second. A tenant's, cluster-wide (`tenant create/set`, columns of `tenants`, enforced by
oz0/tenant_caps.py): schedules, the shortest time between a schedule's runs, live join
tokens.

Pure rules, apart from the modules that enforce them, so that the command line can check
what an operator typed without loading the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oz0.errors import Oz0Error
from oz0.retention_rules import RetentionError, describe, parse_duration

# A tenant's schedules, all of them, paused or not (`tenant set --max-schedules`).
MAX_SCHEDULES_DEFAULT = 100
MAX_SCHEDULES_MIN, MAX_SCHEDULES_MAX = 1, 100_000
# The shortest time between two runs of one of a tenant's schedules, an interval's or a
# cron expression's (`tenant set --min-schedule-interval`): a minute, as cron counts.
# Temporal itself takes a second.
MIN_SCHEDULE_INTERVAL_DEFAULT = 60
MIN_SCHEDULE_INTERVAL_MIN, MIN_SCHEDULE_INTERVAL_MAX = 1, 86_400
# A tenant's join tokens that still let a node in: not revoked, expired or used up
# (`tenant set --max-join-tokens`).
MAX_JOIN_TOKENS_DEFAULT = 100
MAX_JOIN_TOKENS_MIN, MAX_JOIN_TOKENS_MAX = 1, 100_000

# Files stored for pushes (docs/files.md): one file's size, and all of a tenant's files
# together (`tenant set --max-file-size`, `--max-files-size`), in bytes.
MAX_FILE_BYTES_DEFAULT = 64 << 20
MAX_FILES_BYTES_DEFAULT = 4 << 30
MAX_FILE_BYTES_MIN, MAX_FILE_BYTES_MAX = 1, 1 << 40

# Statuses: a cap on how many or how often is 429 (Too Many Requests), as a tenant's
# queued jobs are: the same request succeeds once something is deleted, revoked or waited
# for. A schedule that runs too often is 422: the request itself is what the cap refuses,
# and sent again it never succeeds.
TOO_MANY = 429
REFUSED_AS_ASKED = 422


class CapReached(Oz0Error):
    """A request past a cap: the message says which cap, its limit and the flag or setting
    that changes it, in one line. RETRY_AFTER: seconds until the same request may pass
    (a rate's), else None."""

    def __init__(self, message: str, status: int = TOO_MANY, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.retry_after = retry_after


def _count(what: str, value: int, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RetentionError(f"{what} must be a whole number")
    if not low <= value <= high:
        raise RetentionError(f"{what} must be from {low} to {high}, not {value}")
    return value


def max_schedules(value: int) -> int:
    return _count("max schedules", value, MAX_SCHEDULES_MIN, MAX_SCHEDULES_MAX)


def max_join_tokens(value: int) -> int:
    return _count("max join tokens", value, MAX_JOIN_TOKENS_MIN, MAX_JOIN_TOKENS_MAX)


def max_file_bytes(value: int) -> int:
    return _count("max file size", value, MAX_FILE_BYTES_MIN, MAX_FILE_BYTES_MAX)


def max_files_bytes(value: int) -> int:
    return _count("max files size", value, MAX_FILE_BYTES_MIN, MAX_FILE_BYTES_MAX)


def min_schedule_interval(value: str | int) -> int:
    """Seconds, from what an operator typed (`30s`, `5m`) or the API sent (seconds)."""
    seconds = parse_duration(value) if isinstance(value, str) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise RetentionError("min schedule interval must be seconds or a duration")
    low, high = MIN_SCHEDULE_INTERVAL_MIN, MIN_SCHEDULE_INTERVAL_MAX
    if not low <= seconds <= high:
        raise RetentionError(
            f"min schedule interval must be from {describe(low)} to {describe(high)},"
            f" not {describe(seconds)}"
        )
    return seconds


@dataclass(frozen=True)
class TenantCaps:
    """One tenant's caps, as its row holds them."""

    max_schedules: int = MAX_SCHEDULES_DEFAULT
    min_schedule_interval: int = MIN_SCHEDULE_INTERVAL_DEFAULT
    max_join_tokens: int = MAX_JOIN_TOKENS_DEFAULT


# The lines a refusal says. Each names the cap, its limit and what changes it.


def too_many_schedules(tenant: str, limit: int) -> CapReached:
    return CapReached(
        f"tenant {tenant} has {limit} schedules, its limit (tenant set --max-schedules);"
        " delete one first"
    )


def too_often(tenant: str, when: str, gap: float, limit: int) -> CapReached:
    return CapReached(
        f"{when} runs {describe(max(0, int(gap)))} apart, more often than tenant {tenant}"
        f" allows: at least {describe(limit)} between runs (tenant set"
        " --min-schedule-interval)",
        REFUSED_AS_ASKED,
    )


def too_many_join_tokens(tenant: str, limit: int) -> CapReached:
    return CapReached(
        f"tenant {tenant} has {limit} live join tokens, its limit (tenant set"
        " --max-join-tokens); revoke one first"
    )


def too_many_web_sessions(person: str, limit: int, idle_minutes: int) -> CapReached:
    return CapReached(
        f"{person} has {limit} web sessions open, the limit per person (server start"
        f" --max-web-sessions-per-person); sign out of one, or wait until one has been idle"
        f" {idle_minutes} minutes"
    )


def too_many_live_pages(person: str, limit: int) -> CapReached:
    return CapReached(
        f"{person} has {limit} live pages open on this server, the limit per person (server"
        " start --max-live-pages-per-person); close some and reload"
    )


def too_many_event_streams(person: str, limit: int) -> CapReached:
    return CapReached(
        f"{person} has {limit} event streams open on this server, the limit per person"
        " (server start --max-event-streams-per-person); end one first"
    )


def too_many_requests(person: str, rate: float, burst: int, wait: float) -> CapReached:
    seconds = max(1, math.ceil(wait))
    return CapReached(
        f"{person} sent more than {burst} requests at once or {rate:g} a second to this"
        " server, the limit per person (server start --person-requests-per-second,"
        f" --person-request-burst); try again in {seconds} s",
        retry_after=seconds,
    )
