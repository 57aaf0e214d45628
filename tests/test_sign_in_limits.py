"""Failed web sign-ins: limited per name and source with growing delays (an IPv6 source
by its /64), cleared by a password reset, an unknown name audited under one placeholder
and counted per name as a known one is, old failure rows deleted, and the password checked
(scrypt) outside any transaction on a small limiter. The product's own functions against a
real PostgreSQL; no server runs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
from psycopg import sql

from fixtures.cluster import ClusterFiles
from oz0 import audit, passwords, ui_accounts
from oz0 import ui_sessions as sessions
from oz0.store.pool import Database, open_database

PASSWORD = "the-right-password-1"
HERE, THERE = "192.0.2.1", "198.51.100.7"
NAMES = sessions.Names.of("test", b"a master key of the test's own")
# A little slack on retry-after figures: the database's clock moves while a test runs.
SLACK = 3


# Each test: the admin account with password PASSWORD, and no failed sign-ins counted.
CLEAN = (
    sql.SQL("UPDATE ui_accounts SET password_hash = {} WHERE username = 'admin'").format(
        passwords.hash_password(PASSWORD)
    ),
    "DELETE FROM ui_sign_in_failures",
)


@pytest.fixture
async def db(one_cluster: ClusterFiles) -> AsyncIterator[Database]:
    async with open_database(one_cluster.main_db) as pool:
        yield pool


async def check(
    db: Database, password: str, source: str, username: str = "admin", threads: int = 2
) -> sessions.Verdict:
    limiter = trio.CapacityLimiter(threads)
    return await sessions.check_password(
        db, limiter, username, password, source, NAMES, sessions.FailurePruning()
    )


def age_failures(conn: psycopg.Connection[Any], by: dt.timedelta) -> None:
    """Move every failed sign-in BY into the past (time passes, for the limit)."""
    conn.execute("UPDATE ui_sign_in_failures SET at = at - %s", (by,))


async def test_wrong_passwords_from_one_source_do_not_lock_the_account_out_from_another(
    conn: psycopg.Connection[Any], db: Database
) -> None:
    for _ in range(sessions.FREE_FAILURES):
        assert await check(db, "wrong", HERE) == sessions.Verdict(False)
    # From here: refused unchecked, even the right password, for a while.
    limited = await check(db, PASSWORD, HERE)
    assert limited.limited and not limited.ok
    first = sessions.FIRST_DELAY.total_seconds()
    assert first - SLACK <= limited.retry_after <= first
    # Anyone else signs in at once: the failures are HERE's, not the account's.
    assert await check(db, PASSWORD, THERE) == sessions.Verdict(True)


async def test_each_failure_past_the_free_ones_waits_twice_as_long_up_to_a_cap(
    conn: psycopg.Connection[Any], db: Database
) -> None:
    for _ in range(sessions.FREE_FAILURES):
        assert not (await check(db, "wrong", HERE)).limited
    waited = []
    for _ in range(7):
        limited = await check(db, "wrong", HERE)
        assert limited.limited
        waited.append(limited.retry_after)
        # The wait over: one more try is let through (and fails), and the next waits longer.
        age_failures(conn, dt.timedelta(seconds=limited.retry_after + 1))
        assert await check(db, "wrong", HERE) == sessions.Verdict(False)
    expected = [30, 60, 120, 240, 480, 900, 900]  # seconds: doubling, at most 15 minutes
    assert all(e - SLACK <= w <= e for w, e in zip(waited, expected, strict=True)), waited


async def test_ipv6_sources_in_one_64_count_together(
    conn: psycopg.Connection[Any], db: Database
) -> None:
    for host in range(1, sessions.FREE_FAILURES + 1):
        assert not (await check(db, "wrong", f"2001:db8:1:2::{host}")).limited
    # Any address of that /64 must wait; one of the next /64 need not.
    assert (await check(db, PASSWORD, "2001:db8:1:2:ffff:ffff:ffff:ffff")).limited
    assert await check(db, PASSWORD, "2001:db8:1:3::1") == sessions.Verdict(True)
    assert sessions.source_group("2001:db8:1:2:aaaa::1") == "2001:db8:1:2::/64"
    # An IPv4 client seen through an IPv6 socket is its IPv4 address.
    assert sessions.source_group("::ffff:192.0.2.1") == sessions.source_group("192.0.2.1")


async def test_a_password_reset_clears_the_accounts_failures(
    one_cluster: ClusterFiles, conn: psycopg.Connection[Any], db: Database
) -> None:
    for _ in range(sessions.FREE_FAILURES):
        await check(db, "wrong", HERE)
    assert (await check(db, PASSWORD, HERE)).limited
    new = ui_accounts.reset(
        one_cluster.url, master_key_file=one_cluster.master_key, username="admin"
    )
    assert await check(db, new, HERE) == sessions.Verdict(True)


async def test_tries_made_at_once_cannot_all_pass_the_limit(
    conn: psycopg.Connection[Any], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked = counting_scrypt(monkeypatch, hold=0.0)
    verdicts: list[sessions.Verdict] = []

    async def one() -> None:
        verdicts.append(await check(db, "wrong", HERE, threads=8))

    async with trio.open_nursery() as nursery:
        for _ in range(3 * sessions.FREE_FAILURES):
            nursery.start_soon(one)
    assert sum(1 for v in verdicts if not v.limited) == sessions.FREE_FAILURES
    assert checked.calls == sessions.FREE_FAILURES


class Scrypts:
    """What the patched scrypt saw: calls, how many ran at once at most, and the database
    connections in use while any ran."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0
        self.running = 0
        self.most_at_once = 0
        self.connections_in_use: list[int] = []


def counting_scrypt(
    monkeypatch: pytest.MonkeyPatch, hold: float, db: Database | None = None
) -> Scrypts:
    seen = Scrypts()
    real = hashlib.scrypt

    def counted(*args: Any, **kwargs: Any) -> bytes:
        with seen.lock:
            seen.calls += 1
            seen.running += 1
            seen.most_at_once = max(seen.most_at_once, seen.running)
        if db is not None:
            seen.connections_in_use.append(db.use().in_use)
        time.sleep(hold)
        try:
            return real(*args, **kwargs)
        finally:
            with seen.lock:
                seen.running -= 1

    monkeypatch.setattr("oz0.passwords.hashlib.scrypt", counted)
    return seen


async def test_the_password_is_checked_outside_any_transaction_on_a_small_limiter(
    conn: psycopg.Connection[Any], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions.warm_up()
    seen = counting_scrypt(monkeypatch, hold=0.2, db=db)
    limiter, pruning = trio.CapacityLimiter(2), sessions.FailurePruning()
    sources = [f"203.0.113.{n}" for n in range(6)]

    async def one(source: str) -> None:
        await sessions.check_password(db, limiter, "admin", PASSWORD, source, NAMES, pruning)

    # One at a time: no pooled connection is held while the password is hashed.
    for source in sources[:2]:
        await one(source)
    assert seen.connections_in_use == [0, 0]
    # A crowd at once: hashed two at a time, the limiter's size, not the crowd's.
    async with trio.open_nursery() as nursery:
        for source in sources:
            nursery.start_soon(one, source)
    assert seen.calls == 2 + len(sources)
    assert seen.most_at_once == 2


async def test_an_unknown_name_is_audited_under_one_placeholder_never_the_typed_text(
    conn: psycopg.Connection[Any], db: Database
) -> None:
    typed = "correct-horse-battery-staple"  # a password typed into the username field
    assert await check(db, "wrong", HERE, username=typed) == sessions.Verdict(False)
    entry = audit.entries(conn, action="ui.login.failed", limit=1)[0]  # the newest
    unknown = sessions.UNKNOWN_ACCOUNT
    assert (entry.actor_kind, entry.actor, entry.target) == ("ui", unknown, f"ui:{unknown}")
    for table in ("audit_log", "ui_sign_in_failures"):
        row = conn.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s", (f"%{typed}%",))
        assert row.fetchone() == (0,), table
    # Each unknown name is counted on its own, as a known one is: the next unknown name
    # from there is only wrong, like the real account, until it has failed as often.
    for _ in range(sessions.FREE_FAILURES - 1):
        assert not (await check(db, "wrong", HERE, username=typed)).limited
    assert (await check(db, "wrong", HERE, username=typed)).limited
    assert await check(db, "wrong", HERE, username="someone-else") == sessions.Verdict(False)
    assert await check(db, PASSWORD, HERE) == sessions.Verdict(True)
    # What it is counted under is keyed: the digest of the typed text depends on the key.
    other = sessions.Names.of("test", b"another master key")
    assert NAMES.unknown(typed) != other.unknown(typed)
    assert NAMES.unknown(typed).startswith(sessions.UNKNOWN_ACCOUNT)


async def test_an_unknown_name_costs_one_scrypt_like_a_known_one(
    conn: psycopg.Connection[Any], db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions.warm_up()
    seen = counting_scrypt(monkeypatch, hold=0.0)
    for username in ("nobody", "admin", "nobody-else"):
        before = seen.calls
        assert await check(db, "wrong", HERE, username=username) == sessions.Verdict(False)
        assert seen.calls - before == 1, username


async def test_failure_rows_too_old_to_count_are_deleted_at_most_every_prune_every(
    conn: psycopg.Connection[Any], db: Database
) -> None:
    def old_failures() -> None:
        conn.execute(
            "INSERT INTO ui_sign_in_failures (username, source, at)"
            " SELECT 'admin', '10.0.0.' || n, now() - %s FROM generate_series(1, 50) n",
            (sessions.FAILURE_WINDOW + dt.timedelta(minutes=1),),
        )

    def count() -> Any:
        return conn.execute("SELECT count(*), min(source) FROM ui_sign_in_failures").fetchone()

    # One server's (its web UI's): the first wrong password deletes what is too old...
    pruning, limiter = sessions.FailurePruning(), trio.CapacityLimiter(2)
    old_failures()
    await sessions.check_password(db, limiter, "admin", "wrong", HERE, NAMES, pruning)
    assert count() == (1, HERE)
    # ... and the next ones within PRUNE_EVERY leave it for later.
    old_failures()
    await sessions.check_password(db, limiter, "admin", "wrong", HERE, NAMES, pruning)
    assert count()[0] == 52
