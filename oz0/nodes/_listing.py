"""Listing and counting nodes: the filters (NodeFilter), the listing order, its pages."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from oz0 import listing
from oz0.nodes._model import CONNECTED, CONNECTED_PARAMS, SELECT, Node
from oz0.nodes._rules import LABEL_KEY, STATES, NodeError

LabelFilter = tuple[str, str | None]


def parse_label_filter(text: str) -> LabelFilter:
    """`KEY=VALUE` (a node with that label) or `KEY` (a node with any value for KEY)."""
    key, equals, value = text.partition("=")
    key = key.strip()
    if not LABEL_KEY.fullmatch(key):
        raise NodeError(f"invalid label filter {text!r}: use KEY=VALUE or KEY, e.g. role=web")
    return key, (value if equals else None)


@dataclass(frozen=True)
class NodeFilter:
    """Which nodes a listing or a count takes: those in STATE, of TENANT, with LABEL (KEY
    and VALUE, or KEY with any value) and whose ID or host name holds SEARCH in any case;
    None is any. Every listing and count of nodes takes one, and the API and the web UI
    make it from a request's arguments (`of_args`)."""

    state: str | None = None
    tenant: str | None = None
    label: LabelFilter | None = None
    search: str | None = None

    def __post_init__(self) -> None:
        if self.state is not None and self.state not in STATES:
            raise NodeError(f"unknown state {self.state!r}: use one of {', '.join(STATES)}")

    @classmethod
    def of_args(
        cls,
        *,
        state: str | None = None,
        tenant: str | None = None,
        label: str | None = None,
        search: str | None = None,
    ) -> NodeFilter:
        """The filter a request's arguments ask for, LABEL as text (`parse_label_filter`);
        NodeError for a state or a label filter that is not one."""
        has = parse_label_filter(label) if label is not None else None
        return cls(state=state, tenant=tenant, label=has, search=search)

    def where(self) -> listing.Where:
        """The WHERE clause of this filter (listing.Where: only the filters given). The
        indexes of migration 0012 serve them: state and tenant nodes_state_listing and
        nodes_tenant_listing, in listing order; a label nodes_labels (GIN, `@>` and `?`)."""
        where = listing.Where().equal("state", self.state).equal("tenant", self.tenant)
        if self.label is not None:
            key, value = self.label
            if value is None:
                where = where.also("labels ? %(key)s", key=key)
            else:
                where = where.also("labels @> %(labels)s", labels=Jsonb({key: value}))
        if self.search is not None:
            # strpos, not LIKE: what is searched for is taken literally, `%` and `_` too. No
            # index serves it (see migration 0012): rows are read in listing order until a
            # page is full. An ID is lower case already (its CHECK), a host name is ASCII
            # (oz0.node_strings), so Python's lower() is PostgreSQL's here; done once, not in
            # each row as a prepared statement's generic plan would do it.
            where = where.also(
                "(strpos(id, %(search)s) > 0 OR strpos(hostname_lower, %(search)s) > 0)",
                search=self.search.lower(),
            )
        return where


ANY = NodeFilter()


def _where(wanted: NodeFilter, scope: listing.Scope, after: str | None = None) -> listing.Where:
    """WANTED's clause, in SCOPE's tenants (None: all; one tenant keeps the listing order
    of nodes_tenant_listing); AFTER (a cursor): only the nodes listed after it."""
    where = wanted.where().within("tenant", scope)
    if after is None:
        return where
    # A row comparison: the listing indexes read from this key on, in order.
    after_at, after_id = _listing_key(after)
    return where.also(
        "(joined_at, id) > (%(after_at)s, %(after_id)s)", after_at=after_at, after_id=after_id
    )


def cursor_after(node: Node) -> str:
    """The cursor of the page after one ending with NODE: its place in the listing order."""
    return _cursor(node.joined_at, node.id)


def _cursor(joined_at: dt.datetime, node_id: str) -> str:
    return listing.encode({"joined_at": joined_at.isoformat(), "id": node_id})


def _listing_key(cursor: str) -> tuple[dt.datetime, str]:
    key = listing.decode(cursor, {"joined_at": str, "id": str})
    try:
        joined_at = dt.datetime.fromisoformat(key["joined_at"])
    except ValueError:
        joined_at = None
    if joined_at is None or joined_at.tzinfo is None:
        raise listing.malformed()
    return joined_at, key["id"]


def list_nodes(
    conn: psycopg.Connection[Any],
    matching: NodeFilter = ANY,
    *,
    limit: int | None = None,
    offset: int = 0,
    after: str | None = None,
    scope: listing.Scope = None,
) -> list[Node]:
    """The nodes MATCHING in SCOPE's tenants (None: all), oldest first (by joined_at, then
    ID). AFTER (a cursor, `cursor_after`) starts after that node; LIMIT and OFFSET page
    through them (no LIMIT: all). Raises listing.BadPaging for a malformed cursor."""
    found = _where(matching, scope, after)
    where, order = found.sql, " ORDER BY joined_at, id"
    if offset:
        # The rows skipped are read as IDs only (from the listing indexes where they
        # cover the filters), not as whole rows with their connection worked out.
        where = (
            " WHERE id IN (SELECT id FROM nodes" + where + order
            + " LIMIT %(limit)s OFFSET %(offset)s)"
        )  # fmt: skip
    rows = conn.execute(
        SELECT + where + order + " LIMIT %(limit)s",
        {**CONNECTED_PARAMS, **found.params, "limit": limit, "offset": offset},
    ).fetchall()
    return [Node(*r) for r in rows]


def list_page(
    conn: psycopg.Connection[Any],
    matching: NodeFilter = ANY,
    *,
    limit: int = listing.DEFAULT_LIMIT,
    after: str | None = None,
    scope: listing.Scope = None,
) -> tuple[list[Node], str | None]:
    """One page of `list_nodes` and the cursor of the next one (None: this is the last)."""
    found = list_nodes(conn, matching, limit=limit + 1, after=after, scope=scope)
    if len(found) <= limit:
        return found, None
    return found[:limit], cursor_after(found[limit - 1])


# What Node.to_json gives, as JSON text written by PostgreSQL, keys sorted as the API's
# JSON encoder sorts them: a page of the API costs no Node, no dict and no encoding a row
# in the server's one thread (about half its CPU time a page of 500 before).
_PAGE_JSON = (
    "SELECT json_build_object("
    "'connected', connected, 'hostname', hostname, 'id', id,"
    f" 'joined_at', {listing.iso_sql('joined_at')},"
    " 'labels', coalesce((SELECT json_object_agg(k, v ORDER BY k COLLATE \"C\")"
    "   FROM jsonb_each(labels) AS l(k, v)), '{}'::json),"
    f" 'last_seen', CASE WHEN last_seen IS NOT NULL THEN {listing.iso_sql('last_seen')} END,"
    " 'reason', reason, 'server', CASE WHEN connected THEN server END, 'state', state,"
    " 'tenant', tenant, 'token_id', token_id)::text, joined_at, id"
    f" FROM (SELECT nodes.*, {CONNECTED} AS connected FROM nodes"
)


def list_page_json(
    conn: psycopg.Connection[Any],
    matching: NodeFilter = ANY,
    *,
    limit: int = listing.DEFAULT_LIMIT,
    after: str | None = None,
    scope: listing.Scope = None,
) -> tuple[list[str], str | None]:
    """`list_page`, each node as the JSON text of its to_json(), for the API."""
    where = _where(matching, scope, after)
    rows = conn.execute(
        _PAGE_JSON + where.sql + " ORDER BY joined_at, id LIMIT %(limit)s) AS page"
        " ORDER BY joined_at, id",
        {**CONNECTED_PARAMS, **where.params, "limit": limit + 1},
    ).fetchall()
    if len(rows) <= limit:
        return [r[0] for r in rows], None
    _, joined_at, node_id = rows[limit - 1]
    return [r[0] for r in rows[:limit]], _cursor(joined_at, node_id)


def count_nodes(
    conn: psycopg.Connection[Any],
    matching: NodeFilter = ANY,
    *,
    most: int | None = None,
    scope: listing.Scope = None,
) -> int:
    """How many nodes `list_nodes` lists of those MATCHING in SCOPE, without a LIMIT;
    counting stops at MOST if given (a count of a large fleet reads every row it counts)."""
    where = _where(matching, scope)
    row = conn.execute(
        "SELECT count(*) FROM (SELECT 1 FROM nodes" + where.sql + " LIMIT %(most)s) AS matching",
        {**where.params, "most": most},
    ).fetchone()
    return int(row[0]) if row else 0
