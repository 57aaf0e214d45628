"""Lists the API pages (`limit`, `cursor`, `next_cursor`): follow them to the end, or
until `--limit` rows, printing each page as it comes."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import Annotated, Any

from cyclopts import Parameter

from cli.client import ApiClient
from cli.output import terminal_safe
from oz0.errors import Oz0Error

# Rows a request asks for: the API's default page of nodes (oz0.listing.DEFAULT_LIMIT).
PAGE_SIZE = 500
MAX_PAGE_SIZE = 1000

LimitOption = Annotated[
    int | None, Parameter(name="--limit", help="At most this many rows in all (else every one).")
]
PageSizeOption = Annotated[
    int,
    Parameter(
        name="--page-size",
        help=f"Rows asked for in each request, 1 to {MAX_PAGE_SIZE}; fewer show sooner.",
    ),
]


def check(limit: int | None, page_size: int) -> None:
    if limit is not None and limit < 1:
        raise Oz0Error("--limit must be a whole number of 1 or more")
    if not 1 <= page_size <= MAX_PAGE_SIZE:
        raise Oz0Error(f"--page-size must be a whole number from 1 to {MAX_PAGE_SIZE}")


def pages(
    client: ApiClient,
    path: str,
    query: dict[str, Any],
    key: str,
    *,
    limit: int | None,
    page_size: int,
    start: dict[str, Any] | None = None,
) -> Iterator[list[dict[str, Any]]]:
    """The pages of rows (answer[KEY]) of PATH with QUERY, LIMIT rows in all at most;
    START is sent with the first request only (where to begin: the cursors go on)."""
    left = limit
    cursor: str | None = None
    where = start or {}
    while True:
        ask = page_size if left is None else min(page_size, left)
        answer = client.get(path, {**query, **where, "limit": ask, "cursor": cursor})
        where = {}
        rows: list[dict[str, Any]] = answer[key][:ask]
        yield rows
        if left is not None:
            left -= len(rows)
        cursor = answer.get("next_cursor")
        if cursor is None or not rows or (left is not None and left <= 0):
            return


def print_pages(
    found: Iterator[list[dict[str, Any]]],
    *,
    json_output: bool,
    headers: Sequence[str],
    cells: Callable[[dict[str, Any]], Sequence[Any]],
) -> None:
    """Each page as it comes: JSON, one array in all (as print_json writes it); else a
    table whose columns are as wide as the first page needs, widened by later pages."""
    if json_output:
        _print_json_array(found)
        return
    widths: list[int] = []
    for page in found:
        table = [[terminal_safe(c) for c in cells(row)] for row in page]
        if not widths:
            table.insert(0, [terminal_safe(h) for h in headers])
        widths = [
            max([*widths[i : i + 1], *(len(r[i]) for r in table)]) for i in range(len(headers))
        ]
        for row in table:
            print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        sys.stdout.flush()


def _print_json_array(found: Iterator[list[dict[str, Any]]]) -> None:
    # The same text as json.dump(all_rows, indent=2), one page held at a time; an error
    # between pages leaves the array unclosed, so a script cannot take it for the whole.
    first = True
    for page in found:
        for row in page:
            item = json.dumps(row, indent=2).replace("\n", "\n  ")
            sys.stdout.write(("[\n  " if first else ",\n  ") + item)
            first = False
        sys.stdout.flush()
    sys.stdout.write("[]\n" if first else "\n]\n")
