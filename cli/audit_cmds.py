"""`orchestrator-zero audit ...`"""

from __future__ import annotations

import json as jsonlib

from cyclopts import App

from cli.client import ApiClient
from cli.output import print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select

app = App(name="audit", help="The audit log of every change.")


@app.command(name="list")
def list_(
    *,
    action: str | None = None,
    actor: str | None = None,
    target: str | None = None,
    before: int | None = None,
    limit: int = 50,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """The newest audit rows, newest first.

    Parameters
    ----------
    action
        Only rows of this action, such as operator.renew.
    actor
        Only rows by this actor, such as ui:admin (or a bare name, of any kind).
    target
        Only rows about this target, such as operator:admin.
    before
        Only rows older than this entry ID (the next page: the last ID shown, with --json).
    limit
        At most this many rows.
    """
    data = ApiClient(select(context)).get(
        "/api/v1/audit",
        {"action": action, "actor": actor, "target": target, "before": before, "limit": limit},
    )
    entries = data["entries"]
    if json:
        print_json(entries)
        return 0
    print_table(
        ["TIME", "ACTOR", "ACTION", "TARGET", "DETAILS"],
        [
            [
                e["time"],
                f"{e['actor']['kind']}:{e['actor']['name']}",
                e["action"],
                e["target"],
                jsonlib.dumps(e["details"], sort_keys=True) if e["details"] else "",
            ]
            for e in entries
        ],
    )
    return 0
