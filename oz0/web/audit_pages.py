"""/audit: the audit log, newest first, filtered by action, actor and target in the URL,
paged by a cursor on the id (`?before=ID`), so a page stays cheap however deep."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from quart import Blueprint, request

from oz0 import audit
from oz0.web.pages import Page, Pages, text_arg

PAGE = 50
# Targets with a page of their own: `node:ID` links to /nodes/ID, `job:ID` to /jobs/ID.
LINKED_TARGETS = {"node": "/nodes/", "job": "/jobs/"}


@dataclass(frozen=True)
class Row:
    entry: audit.Entry
    link: str | None
    details: list[tuple[str, str]]


def target_link(target: str) -> str | None:
    kind, _, name = target.partition(":")
    prefix = LINKED_TARGETS.get(kind)
    return f"{prefix}{quote(name, safe='')}" if prefix and name else None


def readable(details: dict[str, Any]) -> list[tuple[str, str]]:
    """Details as `key: value` pairs; a nested value as compact JSON."""
    return [
        (key, value if isinstance(value, str) else json.dumps(value, sort_keys=True))
        for key, value in sorted(details.items())
    ]


def add(web: Blueprint, pages: Pages) -> None:
    @web.get("/audit")
    async def audit_log() -> Page:
        current = await pages.session()
        filters = audit.Filters(
            action=text_arg(request.args, "action"),
            actor=text_arg(request.args, "actor"),
            target=text_arg(request.args, "target"),
        )
        before = audit.cursor(request.args.get("before"))  # junk: the newest page
        scope = current.person.scope

        def read(conn: Any) -> tuple[list[audit.Entry], int | None, list[str]]:
            rows = audit.entries(
                conn,
                action=filters.action,
                actor=filters.actor,
                target=filters.target,
                before=before,
                limit=PAGE + 1,
                scope=scope,
            )
            newer = None
            if before is not None:
                newest = rows[0].id if rows else before - 1
                newer = audit.newer_page(conn, filters, newest, PAGE, scope=scope)
            return rows, newer, audit.actions_seen(conn)

        rows, newer, actions = await pages.state.db.transaction(read)
        shown = rows[:PAGE]
        older = pages.query(before=shown[-1].id) if len(rows) > PAGE else None
        newer_link = None if newer is None else pages.query(before=newer or None)
        return await pages.render(
            "audit.html",
            current,
            rows=[Row(e, target_link(e.target), readable(e.details)) for e in shown],
            filters=filters,
            filtered=any((filters.action, filters.actor, filters.target)),
            actions=actions,
            older=older,
            newer=newer_link,
        )
