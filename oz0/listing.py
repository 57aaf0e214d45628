"""Listings: the WHERE clause of their filters, and keyset paging of the API's lists (the
`limit` asked for and the opaque `cursor`).

A cursor is the sort key of the last row of a page, as base64url (no padding) of a small
JSON object; the next page is the rows after that key. A row inserted or removed between
two pages does not move any other row across the boundary (as an OFFSET would), so every
row present throughout is listed exactly once.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from oz0.errors import Oz0Error

# The tenants a person may see (access.Person.scope): None is every tenant. Every listing,
# count and read of a tenant's objects takes one, and passes it to `Where.within`.
Scope = tuple[str, ...] | None

# Rows in a page of nodes when the caller names no limit, and the most it may ask for.
DEFAULT_LIMIT = 500
MAX_LIMIT = 1000
# A cursor longer than this is not one of ours (ours are well under 200 characters).
_MAX_CURSOR = 512


class BadPaging(Oz0Error):
    pass


@dataclass(frozen=True)
class Where:
    """The WHERE clause of a listing's filters, naming only the filters given.

    Written as `(%(x)s IS NULL OR column = %(x)s)`, a filter not given would still be in
    the statement, and a prepared statement's generic plan (psycopg prepares a statement
    run five times) could then use no index for it: each condition here is a column
    compared as it is stored (`column = %(x)s`, `labels @> %(x)s`), which its index serves.
    """

    conditions: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    def also(self, condition: str, **params: Any) -> Where:
        """This clause AND CONDITION, whose placeholders PARAMS fill."""
        return Where((*self.conditions, condition), {**self.params, **params})

    def equal(self, column: str, value: object | None) -> Where:
        """This clause AND `COLUMN = VALUE`; unchanged if VALUE is None (not filtered)."""
        if value is None:
            return self
        return self.also(f"{column} = %({column})s", **{column: value})

    def within(self, column: str, scope: Scope) -> Where:
        """This clause AND COLUMN (a tenant's name) one of SCOPE's; unchanged if SCOPE is
        None (every tenant). One tenant is compared as `column = %(scope)s`, which a listing
        index led by the tenant keeps in its order; more as `= ANY`. An empty scope
        matches nothing."""
        if scope is None:
            return self
        if len(scope) == 1:
            return self.also(f"{column} = %(scope)s", scope=scope[0])
        return self.also(f"{column} = ANY(%(scope)s)", scope=list(scope))

    @property
    def sql(self) -> str:
        """` WHERE ...` of the conditions, or nothing when there are none."""
        return " WHERE " + " AND ".join(self.conditions) if self.conditions else ""


def reaches(scope: Scope, tenant: str) -> bool:
    """Whether an object of TENANT (a node, a job, a token) is within SCOPE: one outside it
    is answered as not found, as an unknown ID is."""
    return scope is None or tenant in scope


def malformed() -> BadPaging:
    return BadPaging("malformed cursor: pass the next_cursor of the previous page unchanged")


def limit_of(raw: str | None, default: int = DEFAULT_LIMIT, most: int = MAX_LIMIT) -> int:
    """RAW (the `limit` argument) as a page size from 1 to MOST; DEFAULT when absent."""
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 9):
        raise BadPaging(f"limit must be a whole number from 1 to {most}")
    limit = int(raw)
    if not 1 <= limit <= most:
        raise BadPaging(f"limit must be a whole number from 1 to {most}")
    return limit


def encode(key: dict[str, Any]) -> str:
    data = json.dumps(key, separators=(",", ":"), sort_keys=True).encode()
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def decode(raw: str, fields: dict[str, type]) -> dict[str, Any]:
    """The key in cursor RAW, which must hold exactly FIELDS with values of those types."""
    refused = malformed()
    if not raw or len(raw) > _MAX_CURSOR or not raw.isascii():
        raise refused
    try:
        padded = raw + "=" * (-len(raw) % 4)
        key = json.loads(base64.b64decode(padded, altchars=b"-_", validate=True))
    except (binascii.Error, ValueError):
        raise refused from None
    if not isinstance(key, dict) or set(key) != set(fields):
        raise refused
    for name, kind in fields.items():
        # bool is an int to isinstance; no cursor of ours holds one.
        if not isinstance(key[name], kind) or isinstance(key[name], bool):
            raise refused
    return key


def iso_sql(column: str) -> str:
    """SQL giving COLUMN (a timestamptz) as datetime.isoformat() writes it: no fraction
    when there are no microseconds, else six digits (for JSON written by PostgreSQL)."""
    return (
        f"to_char({column}, 'YYYY-MM-DD\"T\"HH24:MI:SS') || CASE WHEN"
        f" extract(microseconds FROM {column})::bigint %% 1000000 = 0 THEN ''"
        f" ELSE to_char({column}, '.US') END || to_char({column}, 'TZH:TZM')"
    )
