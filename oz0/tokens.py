"""Join tokens: a node presenting one joins accepted, in the token's tenant with its labels.

The token a user holds is `tok-<12 hex>.<secret>`; the database keeps only the SHA-256 of
the secret (32 random bytes, so a slow hash would add nothing). Every function here runs
inside the caller's transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import hmac
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Required, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from oz0 import access, audit, listing, node_labels, tenants
from oz0.errors import Oz0Error
from oz0.json_values import iso

# The rules the command line checks too live in a light module of their own; callers keep
# using them from here.
from oz0.token_rules import DEFAULT_MAX_USES as DEFAULT_MAX_USES
from oz0.token_rules import DEFAULT_TTL as DEFAULT_TTL
from oz0.token_rules import TOKEN_ID as TOKEN_ID
from oz0.token_rules import check_labels as check_labels
from oz0.token_rules import parse_label_pairs as parse_label_pairs

MAX_DESCRIPTION = 1000
# The `max_uses` column is a PostgreSQL integer.
MAX_USES_LIMIT = 2**31 - 1
# Far beyond any sensible token, and well inside what a timestamp can hold.
MAX_TTL = dt.timedelta(days=36500)
_TTL = re.compile("^" + "".join(rf"(?:([0-9]{{1,12}}){unit})?" for unit in "dhms") + "$")
# What a node's hostname may take up in an audit row; it comes from the node, unchecked.
_MAX_AUDITED_HOSTNAME = 253

RefusalReason = Literal["unknown", "revoked", "expired", "used_up"]
TokenState = Literal["live", "revoked", "expired", "used_up"]
_REFUSAL_MESSAGES: dict[RefusalReason, str] = {
    "unknown": "join token refused",
    "revoked": "join token revoked",
    "expired": "join token expired",
    "used_up": "join token used up",
}

_COLUMNS = (
    "id, tenant, uses, max_uses, expires_at, labels, description,"
    " revoked_at IS NOT NULL, revoked_at, created_at, created_by, lock_labels"
)


class UnknownTenant(Oz0Error):
    pass


class TokenNotFound(Oz0Error):
    pass


class TokenAlreadyRevoked(Oz0Error):
    pass


class TokenRefused(Oz0Error):
    """A join token that does not let a node in. The message says no more than REASON:
    an unknown id, a wrong secret and a malformed token all read "join token refused"."""

    def __init__(self, reason: RefusalReason, token_id: str | None = None) -> None:
        super().__init__(_REFUSAL_MESSAGES[reason])
        self.reason: RefusalReason = reason
        self.token_id = token_id


class TokenJson(TypedDict):
    """A join token as the API answers it (never its secret)."""

    id: str
    tenant: str
    uses: int
    max_uses: int
    expires_at: str | None
    labels: dict[str, str]
    description: str
    revoked: bool
    revoked_at: str | None
    created_at: str
    created_by: str
    lock_labels: bool


@dataclass(frozen=True)
class JoinToken:
    id: str
    tenant: str
    uses: int
    max_uses: int
    expires_at: dt.datetime | None
    labels: dict[str, str]
    description: str
    revoked: bool
    revoked_at: dt.datetime | None
    created_at: dt.datetime
    created_by: str
    # Its labels are all a node joining with it gets (node_labels).
    lock_labels: bool = False

    def state(self, now: dt.datetime) -> TokenState:
        """Whether a node presenting this token at NOW gets in, or why not (in the order
        `consume` refuses)."""
        if self.revoked:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= now:
            return "expired"
        if self.max_uses > 0 and self.uses >= self.max_uses:
            return "used_up"
        return "live"

    def to_json(self) -> TokenJson:
        return {
            "id": self.id,
            "tenant": self.tenant,
            "uses": self.uses,
            "max_uses": self.max_uses,
            "expires_at": iso(self.expires_at),
            "labels": dict(self.labels),
            "description": self.description,
            "revoked": self.revoked,
            "revoked_at": iso(self.revoked_at),
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "lock_labels": self.lock_labels,
        }


def _token(row: tuple[Any, ...]) -> JoinToken:
    return JoinToken(*row)


def parse_ttl(text: str) -> dt.timedelta | None:
    """A lifetime such as 24h, 30m, 7d, 90s or 1h30m; "0" is never (None)."""
    cleaned = text.strip()
    if cleaned == "0":
        return None
    match = _TTL.fullmatch(cleaned)
    if not cleaned or match is None:
        raise Oz0Error(
            f"invalid ttl {text!r}: use a number with d, h, m or s (such as 24h, 30m, 7d or "
            "1h30m), or 0 for a token that never expires"
        )
    days, hours, minutes, seconds = (int(part) if part else 0 for part in match.groups())
    total = hours * 3600 + minutes * 60 + seconds + days * 86400
    if total == 0:
        raise Oz0Error(
            f"invalid ttl {text!r}: a token must live longer than 0s; "
            "use 0 for a token that never expires"
        )
    if total > MAX_TTL.total_seconds():
        raise Oz0Error(
            f"invalid ttl {text!r}: at most {MAX_TTL.days}d; use 0 for a token that never expires"
        )
    return dt.timedelta(seconds=total)


def _check_description(description: str) -> str:
    if len(description) > MAX_DESCRIPTION or not description.isprintable():
        raise Oz0Error(f"invalid description: use at most {MAX_DESCRIPTION} printable characters")
    return description


_MAX_USES_TYPE = "max uses must be a whole number, 0 for unlimited"


def _check_max_uses(max_uses: int) -> int:
    if max_uses < 0 or max_uses > MAX_USES_LIMIT:
        raise Oz0Error(
            f"invalid max uses {max_uses}: use 0 for unlimited or a number up to {MAX_USES_LIMIT}"
        )
    return max_uses


class TokenBody(TypedDict, total=False):
    """`POST /api/v1/tokens`'s body (TokenSpec.from_json checks it)."""

    tenant: Required[str]
    # How long it lets nodes join: 24h, 7d; 0 for ever.
    ttl: str
    # How many joins it allows (0: any number).
    max_uses: int
    labels: dict[str, str]
    description: str
    lock_labels: bool


@dataclass(frozen=True)
class TokenSpec:
    """What a token is asked for with (the API's JSON body, the web UI's form), checked."""

    tenant: str
    ttl: dt.timedelta | None
    max_uses: int
    labels: dict[str, str]
    description: str
    lock_labels: bool = False

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> TokenSpec:
        """From `{"tenant", "ttl", "max_uses", "labels", "description", "lock_labels"}`; all
        but the tenant optional (DEFAULT_TTL, DEFAULT_MAX_USES, not locked). Oz0Error says
        what is wrong."""
        tenant = body.get("tenant")
        if not isinstance(tenant, str):
            raise Oz0Error("a token needs a `tenant`")
        ttl_text = body.get("ttl", DEFAULT_TTL)
        if not isinstance(ttl_text, str):
            raise Oz0Error("`ttl` must be a string such as 24h, or 0 for never")
        max_uses = body.get("max_uses", DEFAULT_MAX_USES)
        if not isinstance(max_uses, int) or isinstance(max_uses, bool):
            raise Oz0Error(_MAX_USES_TYPE)
        labels = body.get("labels", {})
        if not isinstance(labels, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
        ):
            raise Oz0Error("`labels` must be an object of strings")
        description = body.get("description", "")
        if not isinstance(description, str):
            raise Oz0Error("`description` must be a string")
        lock_labels = body.get("lock_labels", False)
        if not isinstance(lock_labels, bool):
            raise Oz0Error("`lock_labels` must be true or false")
        return cls(
            tenant=tenant,
            ttl=parse_ttl(ttl_text),
            max_uses=_check_max_uses(max_uses),
            labels=check_labels(dict(labels)),
            description=_check_description(description),
            lock_labels=lock_labels,
        )


def check_creator(person: access.Person, spec: TokenSpec) -> None:
    """access.Forbidden unless PERSON may create SPEC: a token that never expires or takes
    any number of nodes outlives its maker's care, so only an admin makes one."""
    if (spec.ttl is None or spec.max_uses == 0) and person.role is not access.Role.ADMIN:
        raise access.Forbidden(
            f"{person.describe()} may not create join tokens that never expire (ttl 0) or"
            " have unlimited uses (max uses 0): only an admin may; give a ttl and a number"
            " of uses"
        )


def _secret_hash(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def create(
    conn: psycopg.Connection[Any],
    *,
    tenant: str,
    ttl: dt.timedelta | None,
    max_uses: int,
    labels: dict[str, str],
    description: str,
    actor: audit.Actor,
    lock_labels: bool = False,
) -> tuple[JoinToken, str]:
    """A new token and the string a node presents: `ID.SECRET`, never stored. LOCK_LABELS:
    its labels are all a node joining with it gets (refused while an older server is up,
    node_labels.check_upgraded)."""
    _check_max_uses(max_uses)
    check_labels(labels)
    _check_description(description)
    if ttl is not None and ttl <= dt.timedelta(0):
        raise Oz0Error("a token's ttl must be positive, or None for one that never expires")
    if not tenants.exists(conn, tenant):
        raise UnknownTenant(f"tenant {tenant} does not exist")
    if lock_labels:
        node_labels.check_upgraded(conn, "--lock-labels")
    token_id = "tok-" + secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    row = conn.execute(
        "INSERT INTO join_tokens"
        " (id, secret_sha256, tenant, labels, description, max_uses, expires_at, created_by,"
        " lock_labels) VALUES (%s, %s, %s, %s, %s, %s, now() + %s::interval, %s, %s)"
        f" RETURNING {_COLUMNS}",
        (
            token_id,
            _secret_hash(secret),
            tenant,
            Jsonb(labels),
            description,
            max_uses,
            ttl,
            f"{actor.kind}:{actor.name}",
            lock_labels,
        ),
    ).fetchone()
    assert row is not None
    token = _token(row)
    audit.record(
        conn,
        actor,
        "token.create",
        f"token:{token.id}",
        {
            "tenant": token.tenant,
            "max_uses": token.max_uses,
            "expires_at": iso(token.expires_at),
            "labels": token.labels,
            "description": token.description,
            # Only when locked: a row without it, of any release, is of an unlocked token.
            **({"lock_labels": True} if token.lock_labels else {}),
        },
        tenants=[token.tenant],
    )
    return token, f"{token.id}.{secret}"


def create_from(
    conn: psycopg.Connection[Any], spec: TokenSpec, actor: audit.Actor
) -> tuple[JoinToken, str]:
    return create(
        conn,
        tenant=spec.tenant,
        ttl=spec.ttl,
        max_uses=spec.max_uses,
        labels=spec.labels,
        description=spec.description,
        actor=actor,
        lock_labels=spec.lock_labels,
    )


def list_tokens(conn: psycopg.Connection[Any], *, scope: listing.Scope = None) -> list[JoinToken]:
    """The tokens of SCOPE's tenants (None: all), oldest first."""
    where = listing.Where().within("tenant", scope)
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM join_tokens" + where.sql + " ORDER BY created_at, id",
        where.params,
    )
    return [_token(r) for r in rows]


def _one(token_id: str, scope: listing.Scope) -> listing.Where:
    return listing.Where().also("id = %(id)s", id=token_id).within("tenant", scope)


def get(
    conn: psycopg.Connection[Any], token_id: str, *, scope: listing.Scope = None
) -> JoinToken | None:
    """The token TOKEN_ID if it is one of SCOPE's tenants' (None: any), else None."""
    where = _one(token_id, scope)
    row = conn.execute(f"SELECT {_COLUMNS} FROM join_tokens" + where.sql, where.params).fetchone()
    return _token(row) if row else None


def revoke(
    conn: psycopg.Connection[Any],
    token_id: str,
    actor: audit.Actor,
    *,
    scope: listing.Scope = None,
    because: dict[str, Any] | None = None,
) -> JoinToken:
    """Stop new joins with TOKEN_ID; nodes that joined with it stay. Another tenant's
    token than SCOPE's (None: any) is not found, as an unknown one. BECAUSE: why, in the
    audit row (its maker left: oz0/leaving.py)."""
    where = _one(token_id, scope)
    row = conn.execute(
        "SELECT revoked_at IS NOT NULL FROM join_tokens" + where.sql + " FOR UPDATE",
        where.params,
    ).fetchone()
    if row is None:
        raise TokenNotFound(f"token {token_id} not found")
    if row[0]:
        raise TokenAlreadyRevoked(f"token {token_id} is already revoked")
    updated = conn.execute(
        f"UPDATE join_tokens SET revoked_at = now() WHERE id = %s RETURNING {_COLUMNS}",
        (token_id,),
    ).fetchone()
    assert updated is not None
    token = _token(updated)
    audit.record(
        conn,
        actor,
        "token.revoke",
        f"token:{token.id}",
        {"tenant": token.tenant, "uses": token.uses, **(because or {})},
        tenants=[token.tenant],
    )
    return token


def consume(conn: psycopg.Connection[Any], token_string: str) -> JoinToken:
    """Count one use of TOKEN_STRING for a joining node, or raise TokenRefused.

    The row stays locked until the caller's transaction ends, so concurrent joins never
    use a token more than `max_uses` times. A refusal writes nothing: the caller records
    it with `record_refusal` in a transaction of its own.
    """
    token_id, dot, secret = token_string.strip().partition(".")
    if not dot or not secret or not TOKEN_ID.fullmatch(token_id):
        raise TokenRefused("unknown")
    presented = _secret_hash(secret)
    row = conn.execute(
        f"SELECT secret_sha256, now(), {_COLUMNS} FROM join_tokens WHERE id = %s FOR UPDATE",
        (token_id,),
    ).fetchone()
    if row is None or not hmac.compare_digest(bytes(row[0]), presented):
        raise TokenRefused("unknown")
    state = _token(row[2:]).state(row[1])
    if state != "live":
        raise TokenRefused(state, token_id)
    updated = conn.execute(
        f"UPDATE join_tokens SET uses = uses + 1 WHERE id = %s RETURNING {_COLUMNS}",
        (token_id,),
    ).fetchone()
    assert updated is not None
    return _token(updated)


class Ledger:
    """The tokens a batch of joins presents, locked until the caller's transaction ends,
    and the uses the batch counts on them: each join is admitted or refused exactly as
    `consume` one after another would, and `write` adds every use in one statement."""

    def __init__(self, rows: dict[str, tuple[bytes, dt.datetime, JoinToken]]) -> None:
        self._rows = rows
        self._taken: dict[str, int] = {}

    @classmethod
    def lock(
        cls, conn: psycopg.Connection[Any], token_strings: Iterable[str], *, lock: bool = True
    ) -> Ledger:
        """Lock the tokens TOKEN_STRINGS name (in ID order, so that two servers' batches
        cannot deadlock on each other). With LOCK false, only read them: a token's uses
        only grow and it is only ever revoked, so what a locked ledger admits later in the
        same transaction is a part of what this one admits."""
        ids = sorted({parsed[0] for s in token_strings if (parsed := _parse(s)) is not None})
        rows = conn.execute(
            f"SELECT secret_sha256, now(), {_COLUMNS} FROM join_tokens WHERE id = ANY(%s)"
            + (" ORDER BY id FOR UPDATE" if lock else ""),
            (ids,),
        ).fetchall()
        return cls({str(r[2]): (bytes(r[0]), r[1], _token(r[2:])) for r in rows})

    def admits(self, token_string: str) -> JoinToken:
        """The token TOKEN_STRING names, as it would be after one more use; TokenRefused
        if it lets no more nodes in. Counts nothing: `take` does."""
        parsed = _parse(token_string)
        found = self._rows.get(parsed[0]) if parsed is not None else None
        if parsed is None or found is None or not hmac.compare_digest(found[0], parsed[1]):
            raise TokenRefused("unknown")
        _, now, token = found
        taken = self._taken.get(token.id, 0)
        state = dataclasses.replace(token, uses=token.uses + taken).state(now)
        if state != "live":
            raise TokenRefused(state, token.id)
        return dataclasses.replace(token, uses=token.uses + taken + 1)

    def take(self, token: JoinToken) -> None:
        """Count one use of TOKEN (as `admits` returned it)."""
        self._taken[token.id] = self._taken.get(token.id, 0) + 1

    def write(self, conn: psycopg.Connection[Any]) -> None:
        """Add the uses taken to the tokens, in one statement."""
        if not self._taken:
            return
        ids = sorted(self._taken)
        conn.execute(
            "UPDATE join_tokens AS t SET uses = t.uses + u.taken"
            " FROM unnest(%s::text[], %s::int[]) AS u(id, taken) WHERE t.id = u.id",
            (ids, [self._taken[i] for i in ids]),
        )


def _parse(token_string: str) -> tuple[str, bytes] | None:
    """The ID and the secret's hash of a token string, None if it is not one."""
    token_id, dot, secret = token_string.strip().partition(".")
    if not dot or not secret or not TOKEN_ID.fullmatch(token_id):
        return None
    return token_id, _secret_hash(secret)


def record_refusal(
    conn: psycopg.Connection[Any], refusal: TokenRefused, *, hostname: str, actor: audit.Actor
) -> None:
    """Audit a refused join as `node.join.refused`: about the token's tenant when the
    token is one (revoked, expired, used up), else about the cluster."""
    known = get(conn, refusal.token_id) if refusal.token_id is not None else None
    audit.record(
        conn,
        actor,
        "node.join.refused",
        f"token:{refusal.token_id or 'unknown'}",
        {"reason": refusal.reason, "hostname": hostname[:_MAX_AUDITED_HOSTNAME]},
        tenants=[known.tenant] if known is not None else [],
    )
