"""Web UI sessions: a random token in a `__Host-` cookie, its SHA-256 in `ui_sessions`.

A session ends at sign-out, after IDLE without a request, or ABSOLUTE after its sign-in,
whichever comes first; every server reads the same rows, so a sign-out ends it everywhere.
Failed sign-ins are counted in the database, per account and per source address, over
FAILURE_WINDOW: past the limits, sign-ins are refused without checking the password.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

import psycopg

from oz0 import access, audit, passwords
from oz0.errors import Oz0Error

COOKIE = "__Host-oz0-session"
IDLE = dt.timedelta(minutes=30)
ABSOLUTE = dt.timedelta(hours=12)
FAILURE_WINDOW = dt.timedelta(minutes=15)
MAX_FAILURES_PER_ACCOUNT = 5
MAX_FAILURES_PER_SOURCE = 20
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


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@functools.cache
def _dummy_hash() -> str:
    """A hash no password matches, made once per process: an unknown username is checked
    against it, so it costs the one scrypt a known one does (and reveals nothing by time)."""
    return passwords.hash_password(secrets.token_urlsafe(16))


def warm_up() -> None:
    """Make the dummy hash now (at the server's start), not at the first unknown name."""
    _dummy_hash()


def _too_many_failures(conn: psycopg.Connection[Any], username: str, source: str) -> bool:
    row = conn.execute(
        "SELECT count(*) FILTER (WHERE username = %(u)s), count(*) FILTER (WHERE source = %(s)s)"
        " FROM ui_sign_in_failures WHERE at > now() - %(window)s"
        " AND (username = %(u)s OR source = %(s)s)",
        {"u": username, "s": source, "window": FAILURE_WINDOW},
    ).fetchone()
    assert row is not None
    return int(row[0]) >= MAX_FAILURES_PER_ACCOUNT or int(row[1]) >= MAX_FAILURES_PER_SOURCE


def check_password(
    conn: psycopg.Connection[Any], username: str, password: str, source: str
) -> bool | None:
    """Whether PASSWORD is USERNAME's; None when sign-ins are refused for now (the limit).

    A failure is counted and audited (`ui.login.failed`) in this transaction."""
    username = username[:MAX_USERNAME]
    if _too_many_failures(conn, username, source):
        return None
    row = conn.execute(
        "SELECT password_hash FROM ui_accounts WHERE username = %s", (username,)
    ).fetchone()
    stored = row[0] if row else _dummy_hash()
    if passwords.verify(password[:MAX_PASSWORD], stored) and row is not None:
        return True
    conn.execute(
        "INSERT INTO ui_sign_in_failures (username, source) VALUES (%s, %s)", (username, source)
    )
    audit.record(
        conn, audit.Actor("ui", username), "ui.login.failed", f"ui:{username}", {"source": source}
    )
    return False


def start(conn: psycopg.Connection[Any], username: str, source: str) -> tuple[str, Session]:
    """A new session for USERNAME, audited `ui.login`; the token for the cookie."""
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


def current(conn: psycopg.Connection[Any], token: str | None) -> Session | None:
    """The session TOKEN names, if it has not expired (its idle clock starts again) and its
    account is an operator's (whose role and tenants it carries)."""
    if not token or len(token) > 100:
        return None
    row = conn.execute(
        "UPDATE ui_sessions s SET last_seen = now() FROM operators o"
        " WHERE s.token_sha256 = %(t)s AND o.name = s.username"
        " AND s.last_seen > now() - %(idle)s AND s.created_at > now() - %(absolute)s"
        " RETURNING s.username, s.csrf, s.created_at, o.role, o.tenants",
        {"t": _digest(token), "idle": IDLE, "absolute": ABSOLUTE},
    ).fetchone()
    if row is None:
        return None
    return Session(row[0], row[1], row[2], access.Role(row[3]), frozenset(row[4]))


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
