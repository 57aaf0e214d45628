"""`orchestrator-zero session ...`: the sessions opened on nodes (`node shell`, `node
exec`), and their recordings played back (docs/sessions.md).

Any person of a tenant sees that its sessions happened; only its admins what they showed
(`session play`).
"""

from __future__ import annotations

import json as jsonlib
import sys
import time
from typing import Annotated, Any

from cyclopts import App, Parameter

from cli.client import ApiClient
from cli.completers import NodeOption
from cli.output import print_fields, print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0.context import select
from oz0.errors import Oz0Error

app = App(name="session", help_format="markdown")  # help: cli/main.py

# A pause in a recording is played back as this at most (asciinema's --idle-time-limit).
DEFAULT_MAX_PAUSE = 2.0


def _ended(session: dict[str, Any]) -> str:
    if session["live"]:
        return "live"
    if session["exit_code"] is not None:
        return f"exit {session['exit_code']}"
    return str(session["why"] or "ended")


@app.command(name="list")
def list_(
    *,
    node: NodeOption = None,
    person: str | None = None,
    live: Annotated[bool, Parameter(negative=())] = False,
    limit: int = 100,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Sessions, newest first.

    Parameters
    ----------
    node
        Only sessions on this node.
    person
        Only sessions of this person (an operator's name).
    live
        Only sessions still open.
    limit
        How many at most (1 to 1000).
    """
    query = {"node": node, "person": person, "live": "true" if live else None, "limit": limit}
    sessions = ApiClient(select(context)).get("/api/v1/sessions", query)["sessions"]
    if json:
        print_json(sessions)
        return 0
    print_table(
        ["ID", "STARTED", "PERSON", "NODE", "COMMAND", "ENDED", "OUTPUT"],
        [
            [
                s["id"], s["started_at"], s["person"], s["node"], " ".join(s["command"]),
                _ended(s), f"{s['output_bytes']} B",
            ]
            for s in sessions
        ],
    )  # fmt: skip
    return 0


@app.command
def show(session_id: str, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """One session: who opened it on what node, when, how it ended."""
    session = ApiClient(select(context)).get(f"/api/v1/sessions/{session_id}")
    if json:
        print_json(session)
        return 0
    print_fields(
        [
            ("id", session["id"]),
            ("tenant", session["tenant"]),
            ("node", session["node"]),
            ("person", session["person"]),
            ("user", session.get("user") or "its own UID"),
            ("command", " ".join(session["command"])),
            ("terminal", f"{session['width']}x{session['height']}"),
            ("started", session["started_at"]),
            ("ended", session["ended_at"] or "live"),
            ("exit code", session["exit_code"]),
            ("why", session["why"]),
            ("input", f"{session['input_bytes']} bytes"),
            ("output", f"{session['output_bytes']} bytes"),
            ("input recorded", session["records_input"]),
            ("server", session["server"]),
        ]
    )
    return 0


@app.command
def play(
    session_id: str,
    /,
    *,
    speed: float = 1.0,
    max_pause: float = DEFAULT_MAX_PAUSE,
    cast: Annotated[bool, Parameter(negative=())] = False,
    context: ContextPath = None,
) -> int:
    """Play a session's recording back in this terminal (admins of its tenant only).

    Parameters
    ----------
    speed
        Play this many times faster (2: twice as fast; 0.5: half as fast).
    max_pause
        Play any longer pause as this many seconds (0: no pause at all).
    cast
        Print the asciicast v2 file instead (for `asciinema play` and other players).
    """
    if not speed > 0:
        raise Oz0Error(f"invalid --speed {speed}: give a number above 0")
    if max_pause < 0:
        raise Oz0Error(f"invalid --max-pause {max_pause}: give 0 or more")
    answer = ApiClient(select(context)).get(f"/api/v1/sessions/{session_id}/recording")
    text: str = answer["asciicast"]
    if cast:
        sys.stdout.write(text)
        return 0
    out = sys.stdout
    previous = 0.0
    for line in text.splitlines()[1:]:
        at, code, data = jsonlib.loads(line)
        pause = min((at - previous) / speed, max_pause / speed if max_pause else 0.0)
        previous = at
        if code != "o":
            continue
        if pause > 0:
            out.flush()
            time.sleep(pause)
        out.write(data)
    out.flush()
    return 0
