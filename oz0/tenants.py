"""Tenants: each has a Temporal namespace of the same name, a job retention (the namespace's
retention matches it), a cap on its jobs queued at once (oz0/retention_rules.py) and caps
on its schedules and join tokens (oz0/cap_rules.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol, Required, TypedDict

import psycopg

from oz0 import audit, cap_rules, listing
from oz0 import retention_rules as rules
from oz0.errors import Oz0Error
from oz0.store.pool import Database

log = logging.getLogger(__name__)

_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")


class TenantRefused(Oz0Error):
    """A tenant that cannot be created; STATUS is the HTTP status the API answers with."""

    status = 400


class InvalidTenantName(TenantRefused):
    pass


class TenantExists(TenantRefused):
    status = 409


class NamespaceUnavailable(TenantRefused):
    status = 503


class TenantNotFound(TenantRefused):
    status = 404


class Namespaces(Protocol):
    async def register_tenant_namespace(self, name: str, retention: int) -> None:
        """Registers the namespace NAME keeping closed workflows RETENTION seconds, or
        finds it registered by us before; TenantExists if Temporal has one of that name
        that is not ours."""

    async def set_namespace_retention(self, name: str, retention: int) -> None:
        """Temporal keeps NAME's closed workflows RETENTION seconds from now on."""


@dataclass(frozen=True)
class Settings:
    """What `tenant create/set` may change: None keeps (or, at creation, defaults) it."""

    job_retention: int | None = None
    max_queued_jobs: int | None = None
    max_schedules: int | None = None
    min_schedule_interval: int | None = None
    max_join_tokens: int | None = None
    max_file_bytes: int | None = None
    max_files_bytes: int | None = None

    @classmethod
    def from_json(cls, body: dict[str, Any], *, also: tuple[str, ...] = ()) -> Settings:
        """From an API body: `job_retention` (seconds, or text such as "30d"),
        `max_queued_jobs`, `max_schedules`, `min_schedule_interval` (as job_retention) and
        `max_join_tokens`, and the fields ALSO (read by the caller); TenantRefused if one is
        out of bounds, or the body has another field (a misspelt one would be lost)."""
        unknown = sorted(set(body) - {*_SETTINGS, *also})
        if unknown:
            raise TenantRefused(f"unknown field {unknown[0]!r}")
        try:
            retention = body.get("job_retention")
            queued = body.get("max_queued_jobs")
            interval = body.get("min_schedule_interval")
            for key, value in (("job_retention", retention), ("min_schedule_interval", interval)):
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, str | int)
                ):
                    raise rules.RetentionError(f"{key} must be seconds or a duration")
            return cls(
                None if retention is None else rules.job_retention(retention),
                None if queued is None else rules.max_queued(queued),
                _maybe(cap_rules.max_schedules, body.get("max_schedules")),
                None if interval is None else cap_rules.min_schedule_interval(interval),
                _maybe(cap_rules.max_join_tokens, body.get("max_join_tokens")),
                _maybe(cap_rules.max_file_bytes, body.get("max_file_bytes")),
                _maybe(cap_rules.max_files_bytes, body.get("max_files_bytes")),
            )
        except rules.RetentionError as e:
            raise TenantRefused(str(e)) from None


class SettingsBody(TypedDict, total=False):
    """`PATCH /api/v1/tenants/<name>`'s body (Settings.from_json checks it): durations in
    seconds or as text ("30d"), caps as numbers; null leaves one as it is."""

    job_retention: int | str | None
    max_queued_jobs: int | str | None
    max_schedules: int | str | None
    min_schedule_interval: int | str | None
    max_join_tokens: int | str | None
    max_file_bytes: int | str | None
    max_files_bytes: int | str | None


class NewTenantBody(SettingsBody, total=False):
    """`POST /api/v1/tenants`'s body."""

    name: Required[str]


_SETTINGS = tuple(SettingsBody.__annotations__)


def _maybe(check: Any, value: Any) -> int | None:
    return None if value is None else int(check(value))


class TenantJson(TypedDict):
    """A tenant and its caps as the API answers them."""

    name: str
    namespace: str
    created_at: str
    job_retention: str
    job_retention_seconds: int | None
    max_queued_jobs: int | None
    max_schedules: int | None
    min_schedule_interval: str
    min_schedule_interval_seconds: int | None
    max_join_tokens: int | None
    max_file_bytes: int | None
    max_files_bytes: int | None


@dataclass(frozen=True)
class Tenant:
    name: str
    created_at: dt.datetime
    job_retention: int = rules.JOB_RETENTION_DEFAULT
    max_queued_jobs: int = rules.MAX_QUEUED_DEFAULT
    max_schedules: int = cap_rules.MAX_SCHEDULES_DEFAULT
    min_schedule_interval: int = cap_rules.MIN_SCHEDULE_INTERVAL_DEFAULT
    max_join_tokens: int = cap_rules.MAX_JOIN_TOKENS_DEFAULT
    max_file_bytes: int = cap_rules.MAX_FILE_BYTES_DEFAULT
    max_files_bytes: int = cap_rules.MAX_FILES_BYTES_DEFAULT

    @property
    def caps(self) -> cap_rules.TenantCaps:
        return cap_rules.TenantCaps(
            self.max_schedules, self.min_schedule_interval, self.max_join_tokens
        )

    def to_json(self) -> TenantJson:
        return {
            "name": self.name,
            "namespace": self.name,
            "created_at": self.created_at.isoformat(),
            "job_retention": rules.describe(self.job_retention),
            "job_retention_seconds": self.job_retention,
            "max_queued_jobs": self.max_queued_jobs,
            "max_schedules": self.max_schedules,
            "min_schedule_interval": rules.describe(self.min_schedule_interval),
            "min_schedule_interval_seconds": self.min_schedule_interval,
            "max_join_tokens": self.max_join_tokens,
            "max_file_bytes": self.max_file_bytes,
            "max_files_bytes": self.max_files_bytes,
        }


_COLUMNS = (
    "name, created_at, job_retention_s, max_queued_jobs, max_schedules,"
    " min_schedule_interval_s, max_join_tokens, max_file_bytes, max_files_bytes"
)


# Temporal's own namespaces (temporal-system, and whatever it adds) take this prefix.
RESERVED_PREFIX = "temporal-"


def check_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise InvalidTenantName(
            f"invalid tenant name {name!r}: use 1 to 63 lowercase letters, digits and '-', "
            "starting with a letter or digit"
        )
    if name.startswith(RESERVED_PREFIX):
        raise InvalidTenantName(
            f"tenant name {name!r} is reserved: names starting with {RESERVED_PREFIX!r} "
            "are Temporal's own namespaces"
        )
    return name


def exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT 1 FROM tenants WHERE name = %s", (name,)).fetchone() is not None


def create(
    conn: psycopg.Connection[Any], name: str, actor: audit.Actor, settings: Settings = Settings()
) -> Tenant:
    retention = settings.job_retention or rules.JOB_RETENTION_DEFAULT
    queued = settings.max_queued_jobs or rules.MAX_QUEUED_DEFAULT
    caps = cap_rules.TenantCaps(
        settings.max_schedules or cap_rules.MAX_SCHEDULES_DEFAULT,
        settings.min_schedule_interval or cap_rules.MIN_SCHEDULE_INTERVAL_DEFAULT,
        settings.max_join_tokens or cap_rules.MAX_JOIN_TOKENS_DEFAULT,
    )
    file_bytes = settings.max_file_bytes or cap_rules.MAX_FILE_BYTES_DEFAULT
    files_bytes = settings.max_files_bytes or cap_rules.MAX_FILES_BYTES_DEFAULT
    row = conn.execute(
        "INSERT INTO tenants (name, job_retention_s, max_queued_jobs, max_schedules,"
        " min_schedule_interval_s, max_join_tokens, max_file_bytes, max_files_bytes)"
        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
        f" ON CONFLICT DO NOTHING RETURNING {_COLUMNS}",
        (check_name(name), retention, queued, caps.max_schedules, caps.min_schedule_interval,
         caps.max_join_tokens, file_bytes, files_bytes),
    ).fetchone()  # fmt: skip
    if row is None:
        raise TenantExists(f"tenant {name} already exists")
    audit.record(
        conn,
        actor,
        "tenant.create",
        f"tenant:{name}",
        {
            "namespace": name,
            "job_retention": rules.describe(retention),
            "max_queued_jobs": queued,
            "max_schedules": caps.max_schedules,
            "min_schedule_interval": rules.describe(caps.min_schedule_interval),
            "max_join_tokens": caps.max_join_tokens,
            "max_file_bytes": file_bytes,
            "max_files_bytes": files_bytes,
        },
        tenants=[name],
    )
    return Tenant(*row)


async def create_with_namespace(
    db: Database,
    temporal: Namespaces,
    name: str,
    actor: audit.Actor,
    settings: Settings = Settings(),
) -> Tenant:
    """A new tenant and its Temporal namespace, as the API and the web UI make it;
    TenantRefused (with its HTTP status) if not, and then nothing is created."""
    check_name(name)
    if await db.transaction(lambda conn: exists(conn, name)):
        raise TenantExists(f"tenant {name} already exists")
    # The namespace first: registering is idempotent, so a failure after it leaves
    # nothing a retry would trip over, while a tenant row without a namespace would.
    retention = settings.job_retention or rules.JOB_RETENTION_DEFAULT
    try:
        await temporal.register_tenant_namespace(name, retention)
    except TenantExists:
        raise
    except Exception as e:
        log.warning("registering namespace %s failed: %r", name, e)
        raise NamespaceUnavailable(f"could not register Temporal namespace {name}: {e}") from None
    return await db.transaction(lambda conn: create(conn, name, actor, settings))


def get(conn: psycopg.Connection[Any], name: str, *, scope: listing.Scope = None) -> Tenant:
    """Tenant NAME if SCOPE reaches it (None: any); TenantNotFound if not."""
    where = listing.Where().also("name = %(name)s", name=name).within("name", scope)
    row = conn.execute(f"SELECT {_COLUMNS} FROM tenants" + where.sql, where.params).fetchone()
    if row is None:
        raise TenantNotFound(f"tenant {name} not found")
    return Tenant(*row)


def change(
    conn: psycopg.Connection[Any], name: str, settings: Settings, actor: audit.Actor
) -> tuple[Tenant, Tenant]:
    """Tenant NAME before and after SETTINGS, with a `tenant.set` audit row saying what
    changed from what (none if nothing did). Its namespace's retention is the caller's to
    change (`set_with_namespace`)."""
    before_row = conn.execute(
        f"SELECT {_COLUMNS} FROM tenants WHERE name = %s FOR UPDATE", (name,)
    ).fetchone()
    if before_row is None:
        raise TenantNotFound(f"tenant {name} not found")
    before = Tenant(*before_row)
    after = dataclasses.replace(
        before,
        job_retention=settings.job_retention or before.job_retention,
        max_queued_jobs=settings.max_queued_jobs or before.max_queued_jobs,
        max_schedules=settings.max_schedules or before.max_schedules,
        min_schedule_interval=settings.min_schedule_interval or before.min_schedule_interval,
        max_join_tokens=settings.max_join_tokens or before.max_join_tokens,
        max_file_bytes=settings.max_file_bytes or before.max_file_bytes,
        max_files_bytes=settings.max_files_bytes or before.max_files_bytes,
    )
    changed: dict[str, dict[str, Any]] = {}
    for key in _SETTINGS:
        was, now = getattr(before, key), getattr(after, key)
        if was != now:
            durations = key in ("job_retention", "min_schedule_interval")
            shown = (rules.describe(was), rules.describe(now)) if durations else (was, now)
            changed[key] = {"from": shown[0], "to": shown[1]}
    if changed:
        conn.execute(
            "UPDATE tenants SET job_retention_s = %s, max_queued_jobs = %s, max_schedules = %s,"
            " min_schedule_interval_s = %s, max_join_tokens = %s, max_file_bytes = %s,"
            " max_files_bytes = %s WHERE name = %s",
            (after.job_retention, after.max_queued_jobs, after.max_schedules,
             after.min_schedule_interval, after.max_join_tokens, after.max_file_bytes,
             after.max_files_bytes, name),
        )  # fmt: skip
        if "job_retention" in changed:
            # A shorter retention should take effect now, not at the next scheduled pass.
            conn.execute("UPDATE cluster_settings SET prune_due_at = now()")
        audit.record(conn, actor, "tenant.set", f"tenant:{name}", changed, tenants=[name])
    return before, after


async def set_with_namespace(
    db: Database,
    temporal: Namespaces,
    name: str,
    settings: Settings,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
) -> Tenant:
    """Change tenant NAME (if SCOPE reaches it), then its namespace's retention to match;
    NamespaceUnavailable if Temporal could not be told (the tenant's row is changed, and
    every server's start sets the namespace's retention to the row's again)."""
    await db.transaction(lambda conn: get(conn, name, scope=scope))
    before, after = await db.transaction(lambda conn: change(conn, name, settings, actor))
    if before.job_retention != after.job_retention:
        try:
            await temporal.set_namespace_retention(name, after.job_retention)
        except Exception as e:
            log.warning("setting namespace %s's retention failed: %r", name, e)
            raise NamespaceUnavailable(
                f"tenant {name} changed, but Temporal's namespace {name} still keeps its"
                f" retention: {e}; run the same `tenant set` again"
            ) from None
    return after


def list_tenants(conn: psycopg.Connection[Any], *, scope: listing.Scope = None) -> list[Tenant]:
    """The tenants of SCOPE (None: every tenant), by name."""
    where = listing.Where().within("name", scope)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM tenants" + where.sql + " ORDER BY name", where.params
    )
    return [Tenant(*r) for r in rows]


def node_counts(
    conn: psycopg.Connection[Any], *, scope: listing.Scope = None
) -> dict[str, dict[str, int]]:
    """Per tenant of SCOPE (None: all), how many of its nodes are in each state (states
    without nodes absent)."""
    where = listing.Where().within("tenant", scope)
    counts: dict[str, dict[str, int]] = {}
    for tenant, state, count in conn.execute(
        "SELECT tenant, state, count(*) FROM nodes" + where.sql + " GROUP BY tenant, state",
        where.params,
    ):
        counts.setdefault(tenant, {})[state] = int(count)
    return counts
