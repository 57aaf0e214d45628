"""Web UI sessions: a random token in a `__Host-` cookie, its SHA-256 in `ui_sessions`.

A session ends at sign-out, after IDLE without a page or form post (live updates and
polls do not count: a tab left open is idle), ABSOLUTE after its sign-in, or once its
operator is removed, whichever comes first; every server reads the same rows, so a
sign-out ends it everywhere.

Failed sign-ins are rows too, counted per typed name and source (an IPv6 source by its
/64: one machine has the whole prefix) and per source alone, over FAILURE_WINDOW. Past the
free ones, each further try waits longer (FIRST_DELAY, doubling up to MAX_DELAY), and is
refused without checking the password until then; a failure from one source never locks
the account out for the others, and a password reset clears the account's failures.
The password is checked (scrypt: tens of milliseconds of CPU) outside any transaction,
on a limiter of few threads, so a crowd of sign-ins holds no pooled connection.

A name with no account is answered as one with an account and a wrong password, at every
step (OWASP's authentication cheat sheet): its password is checked against a dummy hash of
the same cost, and its failures are counted per name too, under a keyed digest of the
typed text (`Names`), so that its lockout comes when a real name's would. Shared counts
for all unknown names would have told them apart: the sixth unknown name from one source
refused (429) while a real one is still only wrong (401).
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from oz0 import access, audit, cap_rules, passwords
from oz0.errors import Oz0Error
from oz0.store.pool import Database

COOKIE = "__Host-oz0-session"
IDLE = dt.timedelta(minutes=30)
ABSOLUTE = dt.timedelta(hours=12)
# How long a failed sign-in counts; older failure rows are deleted.
FAILURE_WINDOW = dt.timedelta(hours=1)
# Failures of one name from one source that cost nothing more; each one after waits
# FIRST_DELAY, doubled per failure, at most MAX_DELAY.
FREE_FAILURES = 5
# Failures from one source, whatever the accounts, before the same delays apply.
FREE_FAILURES_PER_SOURCE = 20
FIRST_DELAY = dt.timedelta(seconds=30)
MAX_DELAY = dt.timedelta(minutes=15)
# How often (per server process) failure rows older than FAILURE_WINDOW are deleted.
PRUNE_EVERY = 60.0
# The account a failure for a name with no account is audited under: never the typed text
# (a password typed into the username field would land in the audit log). Not a valid
# operator name, so no account can have it; its failures are counted under it and a keyed
# digest of the typed text (`Names`).
UNKNOWN_ACCOUNT = "(unknown)"
MAX_USERNAME = 64
MAX_PASSWORD = 1024


class SignInRefused(Oz0Error):
    """Wrong username or password, or too many failures: the page says which, no more."""


@dataclass(frozen=True)
class Session:
    username: str
    csrf: str
    created_at: dt.datetime
    # The operator of the same name's role and tenants, read with the session: a change
    # or removal holds from the next request.
    role: access.Role = access.Role.VIEWER
    tenants: frozenset[str] = frozenset()

    @property
    def person(self) -> access.Person:
        return access.Person("ui", self.username, self.role, self.tenants)

    @property
    def actor(self) -> access.Person:
        return self.person

    def csrf_matches(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given, self.csrf)


@dataclass(frozen=True)
class Verdict:
    """What a password check found: the right password (OK), a wrong one, or no check at
    all because this account and source (or this source) must wait RETRY_AFTER seconds."""

    ok: bool
    retry_after: int = 0

    @property
    def limited(self) -> bool:
        return self.retry_after > 0

    def wait_text(self) -> str:
        """`30 seconds`, `4 minutes`: how long to wait, rounded up, for the page."""
        if self.retry_after < 90:
            return f"{self.retry_after} seconds"
        return f"{-(-self.retry_after // 60)} minutes"


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Names:
    """What the failures of a name with no account are counted under: UNKNOWN_ACCOUNT and
    an HMAC of the typed text, keyed by KEY (from the master key: the same on every server,
    so the count is the cluster's, and unknown to whoever reads only the database, so a
    password typed as a name cannot be guessed back from its row)."""

    key: bytes = field(repr=False)

    @classmethod
    def of(cls, cluster_name: str, master_key: bytes | None) -> Names:
        if master_key is None:
            # A cluster loaded without its master key (tests): counts hold per process.
            return cls(secrets.token_bytes(32))
        derive = HKDF(
            hashes.SHA256(), 32, salt=None, info=f"oz0 sign-in names {cluster_name}".encode()
        )
        return cls(derive.derive(master_key))

    def unknown(self, typed: str) -> str:
        """The key failures of the name TYPED are counted under when no account has it."""
        mac = hmac.new(self.key, typed.encode(), hashlib.sha256).hexdigest()
        return f"{UNKNOWN_ACCOUNT}:{mac[:32]}"


@functools.cache
def _dummy_hash() -> str:
    """A hash no password matches, made once per process: an unknown username is checked
    against it, so it costs the one scrypt a known one does (and reveals nothing by time)."""
    return passwords.hash_password(secrets.token_urlsafe(16))


def warm_up() -> None:
    """Make the dummy hash now (at the server's start), not at the first unknown name."""
    _dummy_hash()


def source_group(source: str) -> str:
    """The source failures are counted under: an IPv4 address as it is, an IPv6 one by
    its /64 (a host gets a whole /64, and could change address within it at will)."""
    try:
        address = ipaddress.ip_address(source)
    except ValueError:
        return source[:100]
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def delay_after(failures: int, free: int) -> dt.timedelta:
    """How long after the last of FAILURES a try waits, when FREE of them cost nothing."""
    if failures < free:
        return dt.timedelta(0)
    return min(MAX_DELAY, FIRST_DELAY * (1 << min(failures - free, 16)))


@dataclass(frozen=True)
class Attempt:
    """A sign-in let through to its password check: the account it is audited under (the
    name, or UNKNOWN_ACCOUNT), the key its failures count under (the name, or
    `Names.unknown`), its stored hash (None: no such account), and the failure row written
    for it in advance (so tries made at once cannot all pass the limit before any has
    failed), deleted if the password is right. Or, with RETRY_AFTER (seconds), a sign-in
    refused unchecked: this name and source, or this source, must wait."""

    account: str
    counted: str
    stored: str | None = None
    failure_id: int | None = None
    retry_after: int = 0


def begin_attempt(
    conn: psycopg.Connection[Any], username: str, source: str, names: Names
) -> Attempt:
    """Let a sign-in of USERNAME from SOURCE through to its password check, or not yet.
    Cheap, so that no connection is held while the hash is checked; the same queries
    whether the name has an account or not."""
    row = conn.execute(
        "SELECT a.password_hash FROM ui_accounts a JOIN operators o ON o.name = a.username"
        " WHERE a.username = %s",
        (username,),
    ).fetchone()
    account = username if row is not None else UNKNOWN_ACCOUNT
    key = username if row is not None else names.unknown(username)
    group = source_group(source)
    # Tries from one source are let through one at a time, so tries made at once cannot
    # all pass the limit together.
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('oz0-sign-in:' || %s))", (group,))
    counted = conn.execute(
        "SELECT count(*) FILTER (WHERE username = %(u)s),"
        " max(at) FILTER (WHERE username = %(u)s), count(*), max(at), now()"
        " FROM ui_sign_in_failures WHERE source = %(s)s AND at > now() - %(window)s",
        {"u": key, "s": group, "window": FAILURE_WINDOW},
    ).fetchone()
    assert counted is not None
    mine, my_last, everyone, last, now = counted
    wait = dt.timedelta(0)
    if my_last is not None:
        wait = max(wait, my_last + delay_after(int(mine), FREE_FAILURES) - now)
    if last is not None:
        wait = max(wait, last + delay_after(int(everyone), FREE_FAILURES_PER_SOURCE) - now)
    if wait > dt.timedelta(0):
        return Attempt(account, key, retry_after=max(1, math.ceil(wait.total_seconds())))
    failure = conn.execute(
        "INSERT INTO ui_sign_in_failures (username, source) VALUES (%s, %s) RETURNING id",
        (key, group),
    ).fetchone()
    assert failure is not None
    return Attempt(account, key, row[0] if row else None, int(failure[0]))


class FailurePruning:
    """When this server last deleted the failures too old to count, so that it does so at
    most every PRUNE_EVERY: one per server (its web UI's), asked from the worker threads
    that settle sign-ins, several at once."""

    def __init__(self, every: float = PRUNE_EVERY) -> None:
        self._every = every
        self._last: float | None = None
        self._lock = threading.Lock()

    def due(self) -> bool:
        """Whether to delete them now; if so, the next time is PRUNE_EVERY from now."""
        with self._lock:
            now = time.monotonic()
            if self._last is not None and now - self._last <= self._every:
                return False
            self._last = now
            return True


def end_attempt(
    conn: psycopg.Connection[Any],
    attempt: Attempt,
    right: bool,
    source: str,
    pruning: FailurePruning,
) -> None:
    """The right password: the failure written in advance goes. A wrong one: it stays,
    and is audited `ui.login.failed` under the attempt's account (never the typed name);
    now and then (PRUNING), failures too old to count are deleted."""
    if right:
        conn.execute("DELETE FROM ui_sign_in_failures WHERE id = %s", (attempt.failure_id,))
        return
    account = attempt.account
    audit.record(
        conn, audit.Actor("ui", account), "ui.login.failed", f"ui:{account}", {"source": source}
    )
    if pruning.due():
        conn.execute("DELETE FROM ui_sign_in_failures WHERE at < now() - %s", (FAILURE_WINDOW,))


def clear_failures(conn: psycopg.Connection[Any], username: str) -> None:
    """Forget USERNAME's failed sign-ins (its password was reset or changed)."""
    conn.execute("DELETE FROM ui_sign_in_failures WHERE username = %s", (username,))


async def check_password(
    db: Database,
    limiter: trio.CapacityLimiter,
    username: str,
    password: str,
    source: str,
    names: Names,
    pruning: FailurePruning,
) -> Verdict:
    """Whether PASSWORD is USERNAME's; refused unchecked while the limit says wait. A name
    with no account costs what a wrong password does, and is counted as one (NAMES); old
    failures are deleted now and then (PRUNING).

    Three steps: the attempt let through (a transaction), scrypt in a thread of LIMITER
    (no connection held meanwhile), the attempt settled (a transaction)."""
    username, password = username[:MAX_USERNAME], password[:MAX_PASSWORD]
    attempt = await db.transaction(lambda conn: begin_attempt(conn, username, source, names))
    if attempt.retry_after:
        return Verdict(False, attempt.retry_after)
    stored = attempt.stored if attempt.stored is not None else _dummy_hash()
    verified = await trio.to_thread.run_sync(passwords.verify, password, stored, limiter=limiter)
    right = verified and attempt.stored is not None
    await db.transaction(lambda conn: end_attempt(conn, attempt, right, source, pruning))
    return Verdict(right)


def start(
    conn: psycopg.Connection[Any], username: str, source: str, *, max_open: int | None = None
) -> tuple[str, Session]:
    """A new session for USERNAME, audited `ui.login`; the token for the cookie. CapReached
    if USERNAME has MAX_OPEN sessions open already (on every server)."""
    if max_open is not None:
        # One sign-in of a person at a time counts, so two at once cannot both pass it.
        conn.execute("SELECT pg_advisory_xact_lock(hashtext('oz0-sessions:' || %s))", (username,))
        if count_open(conn, username) >= max_open:
            idle = int(IDLE.total_seconds() // 60)
            raise cap_rules.too_many_web_sessions(username, max_open, idle)
    token = secrets.token_urlsafe(32)
    csrf = secrets.token_urlsafe(32)
    row = conn.execute(
        "INSERT INTO ui_sessions (token_sha256, username, csrf, source)"
        " SELECT %s, name, %s, %s FROM operators WHERE name = %s"
        " RETURNING created_at, (SELECT role FROM operators WHERE name = username),"
        " (SELECT tenants FROM operators WHERE name = username)",
        (_digest(token), csrf, source, username),
    ).fetchone()
    if row is None:
        raise SignInRefused(f"the web UI account {username} is no operator's")
    audit.record(
        conn, audit.Actor("ui", username), "ui.login", f"ui:{username}", {"source": source},
        tenants=row[2],
    )  # fmt: skip
    return token, Session(username, csrf, row[0], access.Role(row[1]), frozenset(row[2]))


_OPEN = (
    "s.token_sha256 = %(t)s AND o.name = s.username"
    " AND s.last_seen > now() - %(idle)s AND s.created_at > now() - %(absolute)s"
)
_COLUMNS = "s.username, s.csrf, s.created_at, o.role, o.tenants"
_TOUCH = (
    f"UPDATE ui_sessions s SET last_seen = now() FROM operators o WHERE {_OPEN}"
    f" RETURNING {_COLUMNS}"
)
_LOOK = f"SELECT {_COLUMNS} FROM ui_sessions s, operators o WHERE {_OPEN}"


def current(
    conn: psycopg.Connection[Any], token: str | None, *, touch: bool = True
) -> Session | None:
    """The session TOKEN names, if it has not expired and its account is an operator's
    (whose role and tenants it carries). With TOUCH (a page, a form post) its idle clock
    starts again; without (live updates, polls) it does not, so an open tab goes idle."""
    if not token or len(token) > 100:
        return None
    # Only read when not touched: no row version written per live poll.
    row = conn.execute(
        _TOUCH if touch else _LOOK, {"t": _digest(token), "idle": IDLE, "absolute": ABSOLUTE}
    ).fetchone()
    if row is None:
        return None
    return Session(row[0], row[1], row[2], access.Role(row[3]), frozenset(row[4]))


def open_among(
    conn: psycopg.Connection[Any], tokens: Collection[str]
) -> dict[str, tuple[access.Role, frozenset[str]]]:
    """Which of TOKENS name a session that has not ended (signed out, expired, or its
    operator removed), each with its operator's role and tenants now, in one query; none
    of them is touched."""
    wanted = {_digest(t): t for t in tokens if t and len(t) <= 100}
    if not wanted:
        return {}
    rows = conn.execute(
        "SELECT s.token_sha256, o.role, o.tenants FROM ui_sessions s"
        " JOIN operators o ON o.name = s.username WHERE s.token_sha256 = ANY(%(t)s)"
        " AND s.last_seen > now() - %(idle)s AND s.created_at > now() - %(absolute)s",
        {"t": list(wanted), "idle": IDLE, "absolute": ABSOLUTE},
    ).fetchall()
    return {wanted[r[0]]: (access.Role(r[1]), frozenset(r[2])) for r in rows}


def count_open(conn: psycopg.Connection[Any], username: str) -> int:
    """How many of USERNAME's sessions have not expired, on every server."""
    row = conn.execute(
        "SELECT count(*) FROM ui_sessions WHERE username = %(u)s"
        " AND last_seen > now() - %(idle)s AND created_at > now() - %(absolute)s",
        {"u": username, "idle": IDLE, "absolute": ABSOLUTE},
    ).fetchone()
    assert row is not None
    return int(row[0])


def end_others(conn: psycopg.Connection[Any], username: str, keep: str | None = None) -> int:
    """End USERNAME's sessions on every server but the one token KEEP names; how many."""
    return conn.execute(
        "DELETE FROM ui_sessions WHERE username = %s AND token_sha256 <> %s",
        (username, _digest(keep) if keep else ""),
    ).rowcount


def end(conn: psycopg.Connection[Any], token: str | None) -> None:
    if token:
        conn.execute("DELETE FROM ui_sessions WHERE token_sha256 = %s", (_digest(token),))
    # Expired sessions are of no use to anyone.
    conn.execute(
        "DELETE FROM ui_sessions WHERE last_seen < now() - %s OR created_at < now() - %s",
        (IDLE, ABSOLUTE),
    )
