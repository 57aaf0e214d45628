"""Web UI accounts' passwords: the rules for a new one, changing it, and the reset a
server's operator makes with the master key (`server ui-password`)."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import psycopg

from oz0 import audit, passwords, pki
from oz0 import cluster as cluster_mod
from oz0 import ui_sessions as sessions
from oz0.errors import Oz0Error
from oz0.store import databases, migrations
from oz0.store.dburl import DatabaseUrl

MIN_PASSWORD = 12


class PasswordRefused(Oz0Error):
    """A new password the rules refuse; the message says which rule."""


def check_new(password: str, again: str) -> str:
    if password != again:
        raise PasswordRefused("The new passwords differ; type the same one twice.")
    if len(password) < MIN_PASSWORD:
        raise PasswordRefused(
            f"The new password is too short: use at least {MIN_PASSWORD} characters."
        )
    if len(password) > sessions.MAX_PASSWORD:
        raise PasswordRefused(
            f"The new password is too long: use at most {sessions.MAX_PASSWORD} characters."
        )
    return password


def set_password(
    conn: psycopg.Connection[Any],
    username: str,
    password: str,
    actor: audit.Actor,
    action: str,
    *,
    keep_session: str | None = None,
) -> None:
    """USERNAME's password is now PASSWORD (stored as its scrypt hash), audited ACTION;
    every session of the account ends on every server, but the one KEEP_SESSION names."""
    set_password_hash(
        conn, username, passwords.hash_password(password), actor, action, keep_session=keep_session
    )


def set_password_hash(
    conn: psycopg.Connection[Any],
    username: str,
    password_hash: str,
    actor: audit.Actor,
    action: str,
    *,
    keep_session: str | None = None,
) -> None:
    """`set_password` with the hash made beforehand (by the web UI, outside its
    transaction). The account's failed sign-ins are forgotten: whoever had the password
    wrong before has no reason to wait now, and its owner can sign in at once."""
    updated = conn.execute(
        "UPDATE ui_accounts SET password_hash = %s WHERE username = %s",
        (password_hash, username),
    ).rowcount
    if not updated:
        raise Oz0Error(f"the cluster has no web UI account {username}")
    ended = sessions.end_others(conn, username, keep_session)
    sessions.clear_failures(conn, username)
    # About the account's operator's tenants (none: a cluster-wide one).
    of = conn.execute("SELECT tenants FROM operators WHERE name = %s", (username,)).fetchone()
    audit.record(
        conn, actor, action, f"ui:{username}", {"sessions_ended": ended},
        tenants=of[0] if of else [],
    )  # fmt: skip


def reset(url: DatabaseUrl, *, master_key_file: Path, username: str) -> str:
    """A new generated password for USERNAME, which the caller prints once; the master key
    proves the caller is a server's operator (as for `server operator issue`)."""
    master_key = pki.read_master_key(master_key_file)
    password = passwords.generate()
    with databases.connect(url.for_database(url.names.main)) as conn:
        databases.check_server_version(conn)
        migrations.check_current(conn)
        cluster_mod.load(conn, master_key)
        with conn.transaction():
            set_password(
                conn,
                username[: sessions.MAX_USERNAME],
                password,
                audit.Actor("server", f"local:{platform.node()}"),
                "ui.password.reset",
            )
    return password
