"""The caps on one person and one tenant, without a server: the request bucket's rate,
burst and bounded memory on a given clock; live pages capped per person across sessions;
and, against a real PostgreSQL, web sessions per person, schedules and join tokens per
tenant (revoked, expired and used-up tokens not counted), a schedule's shortest interval,
each refusal one line naming its limit and its flag. tests/test_person_caps.py checks the
same through a real server.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import psycopg
import pytest
from psycopg.types.json import Jsonb

from fixtures.web_events import events
from oz0 import access, audit, cap_rules, tenant_caps, tenants, tokens
from oz0 import ui_sessions as sessions
from oz0.server.person_limits import PersonLimits, RequestBuckets
from oz0.web.live import Feed, Stream

ADMIN = audit.Actor("operator", "admin")
VIEWER = (access.Role.VIEWER, frozenset[str]())


def test_a_person_gets_a_burst_then_the_rate_and_others_keep_their_own() -> None:
    buckets = RequestBuckets(rate=2.0, burst=5)
    assert [buckets.take("alice", 100.0) for _ in range(5)] == [0.0] * 5
    assert buckets.take("alice", 100.0) == pytest.approx(0.5)  # one token at 2 a second
    assert buckets.take("bob", 100.0) == 0.0  # not slowed by alice
    assert buckets.take("alice", 100.5) == 0.0  # refilled
    assert buckets.take("alice", 100.5) > 0
    # Idle long enough, a full burst again, never more.
    assert [buckets.take("alice", 200.0) for _ in range(5)] == [0.0] * 5
    assert buckets.take("alice", 200.0) > 0


def test_the_buckets_are_bounded_forgetting_the_least_recently_used() -> None:
    buckets = RequestBuckets(rate=1.0, burst=1, max_people=3)
    for n in range(10):
        buckets.take(f"person-{n}", 0.0)
    assert len(buckets) == 3
    # person-9 is kept (refused), person-0 forgotten (a full bucket again).
    assert buckets.take("person-9", 0.0) > 0
    assert buckets.take("person-0", 0.0) == 0.0


def test_a_refused_request_names_the_cap_its_limit_and_its_flags() -> None:
    limits = PersonLimits(requests_per_second=2.0, request_burst=3)
    for _ in range(3):
        limits.take_request("alice", 0.0)
    with pytest.raises(cap_rules.CapReached) as refused:
        limits.take_request("alice", 0.0)
    e = refused.value
    assert (e.status, e.retry_after) == (429, 1)
    assert str(e) == (
        "alice sent more than 3 requests at once or 2 a second to this server, the limit per"
        " person (server start --person-requests-per-second, --person-request-burst); try"
        " again in 1 s"
    )
    assert "\n" not in str(e)


async def test_one_person_holds_at_most_their_live_pages_whatever_their_sessions() -> None:
    feed = Feed(per_person=3)
    # Three sessions of one viewer, one page each: the cap, though no session is full.
    held = [feed.held(Stream(frozenset(), False, f"s{n}", VIEWER, person="vic"), events())
            for n in range(3)]  # fmt: skip
    for h in held:
        await anext(h)
    full = feed.full_for("s9", "vic")
    assert full == (
        "vic has 3 live pages open on this server, the limit per person (server start"
        " --max-live-pages-per-person); close some and reload"
    )
    assert feed.full_for("s0", "eve") is None  # another person is not held up
    late = feed.held(Stream(frozenset(), False, "s9", VIEWER, person="vic"), events())
    assert [event async for event in late] == []
    for h in held:
        await h.aclose()
    assert feed.full_for("s9", "vic") is None


CLEAN = (
    "DELETE FROM ui_sessions",
    "DELETE FROM join_tokens",
    "DELETE FROM schedules",
    "DELETE FROM tenants WHERE name <> 'default'",
    "UPDATE tenants SET max_schedules = DEFAULT, min_schedule_interval_s = DEFAULT,"
    " max_join_tokens = DEFAULT",
)


def test_a_sign_in_past_a_persons_open_sessions_is_refused(
    conn: psycopg.Connection[Any],
) -> None:
    for _ in range(2):
        sessions.start(conn, "admin", "192.0.2.1", max_open=2)
    with pytest.raises(cap_rules.CapReached) as refused:
        sessions.start(conn, "admin", "192.0.2.1", max_open=2)
    assert str(refused.value) == (
        "admin has 2 web sessions open, the limit per person (server start"
        " --max-web-sessions-per-person); sign out of one, or wait until one has been idle"
        " 30 minutes"
    )
    assert refused.value.status == 429
    assert sessions.count_open(conn, "admin") == 2
    # One gone idle no longer counts.
    conn.execute(
        "UPDATE ui_sessions SET last_seen = now() - %s"
        " WHERE token_sha256 = (SELECT min(token_sha256) FROM ui_sessions)",
        (sessions.IDLE,),
    )
    sessions.start(conn, "admin", "192.0.2.1", max_open=2)


def token(conn: psycopg.Connection[Any], tenant: str = "default", **spec: Any) -> str:
    tenant_caps.room_for_token(conn, tenant)
    made, _ = tokens.create_from(
        conn, tokens.TokenSpec.from_json({"tenant": tenant, **spec}), ADMIN
    )
    return made.id


def test_join_tokens_per_tenant_count_only_those_that_let_a_node_in(
    conn: psycopg.Connection[Any],
) -> None:
    tenants.create(conn, "other", ADMIN)
    tenants.change(conn, "default", tenants.Settings(max_join_tokens=3), ADMIN)
    assert tenants.get(conn, "default").max_join_tokens == 3
    revoked, expired, used_up = token(conn), token(conn), token(conn, max_uses=1)
    with pytest.raises(cap_rules.CapReached) as refused:
        token(conn)
    assert str(refused.value) == (
        "tenant default has 3 live join tokens, its limit (tenant set --max-join-tokens);"
        " revoke one first"
    )
    token(conn, "other")  # another tenant's are its own
    tokens.revoke(conn, revoked, ADMIN)
    conn.execute("UPDATE join_tokens SET expires_at = now() WHERE id = %s", (expired,))
    conn.execute("UPDATE join_tokens SET uses = 1 WHERE id = %s", (used_up,))
    for _ in range(3):
        token(conn)
    with pytest.raises(cap_rules.CapReached):
        token(conn)


def schedule_row(conn: psycopg.Connection[Any], tenant: str, n: int) -> None:
    conn.execute(
        "INSERT INTO schedules (id, tenant, spec, created_by) VALUES (%s, %s, %s, 'test')",
        (f"sched-{n:012x}", tenant, Jsonb({})),
    )


def test_schedules_per_tenant_and_the_shortest_interval(
    conn: psycopg.Connection[Any],
) -> None:
    tenants.change(
        conn, "default", tenants.Settings(max_schedules=2, min_schedule_interval=30), ADMIN
    )
    for n in range(2):
        tenant_caps.room_for_schedule(conn, "default", when="every 30s", every=30)
        schedule_row(conn, "default", n)
    with pytest.raises(cap_rules.CapReached) as refused:
        tenant_caps.room_for_schedule(conn, "default", when="every 1h", every=3600)
    assert str(refused.value) == (
        "tenant default has 2 schedules, its limit (tenant set --max-schedules); delete one first"
    )
    assert refused.value.status == 429
    conn.execute("DELETE FROM schedules")
    with pytest.raises(cap_rules.CapReached) as refused:
        tenant_caps.room_for_schedule(conn, "default", when="every 29s", every=29)
    assert str(refused.value) == (
        "every 29s runs 29s apart, more often than tenant default allows: at least 30s"
        " between runs (tenant set --min-schedule-interval)"
    )
    assert refused.value.status == 422
    # A cron expression: by the runs Temporal worked out for it.
    caps = tenant_caps.caps_of(conn, "default")
    assert caps is not None
    base = dt.datetime(2030, 1, 1, tzinfo=dt.UTC)
    minutes = [base + dt.timedelta(minutes=m) for m in (0, 1, 2)]
    tenant_caps.check_runs("default", "cron '* * * * *' (UTC)", minutes, caps)
    seconds = [base + dt.timedelta(seconds=s) for s in (0, 10, 20)]
    with pytest.raises(cap_rules.CapReached, match="runs 10s apart"):
        tenant_caps.check_runs("default", "cron '*/10 * * * * * *' (UTC)", seconds, caps)


def test_a_tenants_caps_are_set_checked_and_audited(conn: psycopg.Connection[Any]) -> None:
    settings = tenants.Settings.from_json(
        {"max_schedules": 5, "min_schedule_interval": "5m", "max_join_tokens": 7}
    )
    before, after = tenants.change(conn, "default", settings, ADMIN)
    assert (after.max_schedules, after.min_schedule_interval, after.max_join_tokens) == (
        5, 300, 7,
    )  # fmt: skip
    assert before.caps == cap_rules.TenantCaps()  # the migration's defaults are the rules'
    assert cap_rules.TenantCaps() == cap_rules.TenantCaps(100, 60, 100)
    shown = after.to_json()
    assert (shown["min_schedule_interval"], shown["min_schedule_interval_seconds"]) == (
        "5m", 300,
    )  # fmt: skip
    entry = audit.entries(conn, action="tenant.set", limit=1)[0]
    assert entry.details["min_schedule_interval"] == {"from": "1m", "to": "5m"}
    assert entry.details["max_join_tokens"] == {"from": 100, "to": 7}
    for body in ({"max_schedules": 0}, {"min_schedule_interval": "2d"}, {"max_join_tokens": True}):
        with pytest.raises(tenants.TenantRefused):
            tenants.Settings.from_json(body)
