"""`orchestrator-zero audit ...`"""

from __future__ import annotations

import json as jsonlib
from pathlib import Path
from typing import Annotated, Any

from cyclopts import App, Parameter

from cli.client import ApiClient
from cli.output import terminal_safe, warn
from cli.paging import PAGE_SIZE, LimitOption, PageSizeOption, check, pages, print_pages
from cli.params import ContextPath, JsonFlag
from oz0.context import select
from oz0.errors import Oz0Error

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


@app.command
def follow(
    *,
    kind: Annotated[tuple[str, ...], Parameter(consume_multiple=False)] = (),
    after: str | None = None,
    keepalive: int = 15,
    give_up_after: float | None = None,
    cursor_file: Path | None = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """The audit rows as they are committed, one line each, until interrupted; after a
    disconnect it resumes by itself (from the next server of the context if one is down)
    with nothing skipped or shown twice. Each loss and each attempt is said on stderr.

    Parameters
    ----------
    kind
        Only rows of this action (node.accept) or of its family (node: node.accept,
        node.join.refused, ...); repeat for several.
    after
        Start after this cursor (an event's `cursor`, with --json), or `start` for every
        row kept; else from now.
    keepalive
        Seconds between the server's keep-alive lines when nothing happens (1 to 300); a
        stream silent for this and 10 more is taken as lost.
    give_up_after
        Exit (1, with the cursor to resume from) once no server has answered for this
        many seconds; else it tries for ever.
    cursor_file
        Keep the cursor in this file (0600) as lines come, and start from it when it
        exists (and no --after is given): a forwarder restarted goes on where it was.
    """
    import os
    import signal
    import sys

    from cli.audit_follow import Follower, cursor_saver, read_cursor_file

    if not 1 <= keepalive <= 300:
        raise Oz0Error("--keepalive must be 1 to 300 seconds")
    if give_up_after is not None and give_up_after <= 0:
        raise Oz0Error("--give-up-after must be a number of seconds above 0")
    if after is None and cursor_file is not None:
        after = read_cursor_file(cursor_file)
    client = ApiClient(select(context))

    def show(event: dict[str, Any]) -> None:
        if json:
            sys.stdout.write(jsonlib.dumps(event, sort_keys=True, separators=(",", ":")) + "\n")
        else:
            sys.stdout.write(_text_line(event) + "\n")
        sys.stdout.flush()

    follower = Follower(
        lambda server, path, timeout: client.open_stream(server, path, read_timeout=timeout),
        lambda: client.context.addresses,
        show,
        warn,
        kinds=kind,
        cursor=after,
        keepalive=keepalive,
        give_up_after=give_up_after,
        save=cursor_saver(cursor_file) if cursor_file is not None else None,
    )
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, follower.interrupt)
    try:
        follower.run()
    except KeyboardInterrupt:
        warn(f"audit follow: stopped; {follower.resume()}")
        raise
    except BrokenPipeError:
        # The reader went away (`| head`): done, as `yes | head` is.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    return 0


def _text_line(event: dict[str, Any]) -> str:
    actor = event.get("actor") or {}
    details = event.get("details")
    cells = [
        event.get("time"),
        f"{actor.get('kind')}:{actor.get('name')}",
        event.get("action"),
        event.get("target"),
        jsonlib.dumps(details, sort_keys=True) if details else "",
    ]
    return "  ".join(terminal_safe(c) for c in cells).rstrip()
