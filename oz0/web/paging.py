"""`?page=N` for lists of the web UI: which page, and the links to its neighbours.

(pages.py has `query` for the links; this reads the number and builds both links, for
the token and job lists.)
"""

from __future__ import annotations

from quart import request

from oz0.web.pages import Pages

ROWS = 50
# Far beyond any real list; keeps the OFFSET a query computes small.
MAX_PAGE = 100_000


def page_number() -> int:
    """This request's `?page=N`, 1 when absent or not a number."""
    try:
        return min(MAX_PAGE, max(1, int(request.args.get("page", "1"))))
    except ValueError:
        return 1


def links(pages: Pages, page: int, more: bool) -> tuple[str | None, str | None]:
    """The (newer, older) links of page PAGE for `m.pager`; MORE: rows follow this page."""
    newer = pages.query(page=page - 1 if page > 2 else None) if page > 1 else None
    older = pages.query(page=page + 1) if more else None
    return newer, older
