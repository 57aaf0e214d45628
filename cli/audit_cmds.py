"""`orchestrator-zero audit ...`"""

from __future__ import annotations

import json as jsonlib

from cyclopts import App

from cli.client import ApiClient
from cli.paging import PAGE_SIZE, LimitOption, PageSizeOption, check, pages, print_pages
from cli.params import ContextPath, JsonFlag
from oz0.context import select

app = App(name="audit", help_format="markdown")  # help: cli/main.py


@app.command(name="list")
def list_(
    *,
    action: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    before: int | None = None,
    limit: LimitOption = None,
    page_size: PageSizeOption = PAGE_SIZE,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """The audit rows, newest first, every one unless --limit says how many. Pages are
    fetched one after another and printed as they come.

    Parameters
    ----------
    action
        Only rows of this action, such as operator.renew.
    actor
        Only rows by this actor, such as ui:admin (or a bare name, of any kind).
    target
        Only rows about this target, such as operator:admin.
    before
        Only rows older than this entry ID (such as the last ID shown, with --json).
    """
    check(limit, page_size)
    query = {"action": action, "actor": actor, "target": target}
    found = pages(
        ApiClient(select(context)), "/api/v1/audit", query, "entries", limit=limit,
        page_size=page_size, start={"before": before},
    )  # fmt: skip
    print_pages(
        found,
        json_output=json,
        headers=["TIME", "ACTOR", "ACTION", "TARGET", "DETAILS"],
        cells=lambda e: [
            e["time"],
            f"{e['actor']['kind']}:{e['actor']['name']}",
            e["action"],
            e["target"],
            jsonlib.dumps(e["details"], sort_keys=True) if e["details"] else "",
        ],
    )
    return 0
