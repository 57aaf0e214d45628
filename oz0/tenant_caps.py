"""A tenant's caps on its schedules and join tokens (`tenant create/set --max-schedules,
--min-schedule-interval, --max-join-tokens`; bounds and refusals in oz0/cap_rules.py),
each checked in the transaction that makes one.

The count is taken with the tenant's makings of that kind taking turns (a transaction
lock), so two at once cannot both pass the last place. A tenant that does not exist has
no caps here: the making refuses it with its own line.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Sequence
from typing import Any

import psycopg

from oz0 import cap_rules
from oz0.cap_rules import TenantCaps


def caps_of(conn: psycopg.Connection[Any], tenant: str) -> TenantCaps | None:
    row = conn.execute(
        "SELECT max_schedules, min_schedule_interval_s, max_join_tokens FROM tenants"
        " WHERE name = %s",
        (tenant,),
    ).fetchone()
    return None if row is None else TenantCaps(int(row[0]), int(row[1]), int(row[2]))


def _turn(conn: psycopg.Connection[Any], what: str, tenant: str) -> None:
    conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"oz0-{what}:{tenant}",))


def room_for_schedule(
    conn: psycopg.Connection[Any], tenant: str, *, when: str, every: float | None
) -> TenantCaps | None:
    """Whether TENANT may have one more schedule, running WHEN (`every 5s`, EVERY seconds
    apart; None: a cron expression, its times checked by `check_runs`); CapReached if not.
    Its caps, for the caller's further checks."""
    _turn(conn, "schedules", tenant)
    caps = caps_of(conn, tenant)
    if caps is None:
        return None
    if every is not None and every < caps.min_schedule_interval:
        raise cap_rules.too_often(tenant, when, every, caps.min_schedule_interval)
    row = conn.execute("SELECT count(*) FROM schedules WHERE tenant = %s", (tenant,)).fetchone()
    if row is not None and int(row[0]) >= caps.max_schedules:
        raise cap_rules.too_many_schedules(tenant, caps.max_schedules)
    return caps


def check_runs(tenant: str, when: str, times: Sequence[dt.datetime], caps: TenantCaps) -> None:
    """CapReached if two of TIMES (a schedule's next runs, as Temporal worked them out from
    its cron expression) are closer than TENANT's shortest interval allows."""
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(sorted(times))]
    if gaps and min(gaps) < caps.min_schedule_interval:
        raise cap_rules.too_often(tenant, when, min(gaps), caps.min_schedule_interval)


def room_for_token(conn: psycopg.Connection[Any], tenant: str) -> None:
    """Whether TENANT may have one more join token that lets a node in; CapReached if not.
    Revoked, expired and used-up tokens do not count."""
    _turn(conn, "join-tokens", tenant)
    caps = caps_of(conn, tenant)
    if caps is None:
        return
    row = conn.execute(
        "SELECT count(*) FROM join_tokens WHERE tenant = %s AND revoked_at IS NULL"
        " AND (expires_at IS NULL OR expires_at > now()) AND (max_uses = 0 OR uses < max_uses)",
        (tenant,),
    ).fetchone()
    if row is not None and int(row[0]) >= caps.max_join_tokens:
        raise cap_rules.too_many_join_tokens(tenant, caps.max_join_tokens)
