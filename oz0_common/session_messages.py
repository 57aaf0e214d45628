"""The session messages, typed once for the three ends that speak them (docs/sessions.md):
the CLI and the management API (a websocket on 8443), the edge and the node (the node's
control stream).

On the control stream (each names its session, `session`):
- edge → node: `session_open` (its grant, command, window size), `session_input` (bytes,
  base64), `session_resize` (rows, cols), `session_close` (why);
- node → edge: `session_started` (who it runs as), `session_refused` (why),
  `session_output` (bytes, base64), `session_exit` (its exit code).

Between the CLI and its server the same meanings without the prefix and without the
session's ID, which the connection names: `open`, `input`, `resize` from the CLI;
`started`, `output`, `exit`, `error` (one line, then the server closes) and `elsewhere`
(the node's stream is held by another server: the CLI connects there) from the server.

Parsing is the receiving side's: a malformed message raises BadSessionMessage.
"""

from __future__ import annotations

import base64
import binascii
import re
import secrets
from dataclasses import dataclass
from typing import Any

OPEN = "session_open"
INPUT = "session_input"
RESIZE = "session_resize"
CLOSE = "session_close"
STARTED = "session_started"
REFUSED = "session_refused"
OUTPUT = "session_output"
EXIT = "session_exit"
FROM_NODE = (STARTED, REFUSED, OUTPUT, EXIT)

SESSION_ID = re.compile(r"session-[0-9a-f]{12}\Z")
# A terminal larger than this is no terminal.
MAX_SIDE = 10_000
# What one message carries, before base64: the node reads its PTY in pieces this large.
MAX_DATA = 64 * 1024
MAX_COMMAND = 64 * 1024


class BadSessionMessage(ValueError):
    """A message that is not what its type says; the text says why, in one line."""


def new_id() -> str:
    return "session-" + secrets.token_hex(6)


def session_of(message: dict[str, Any]) -> str:
    value = message.get("session")
    if not isinstance(value, str) or not SESSION_ID.match(value):
        raise BadSessionMessage(f"{message.get('type')} names no valid session")
    return value


def data_of(message: dict[str, Any]) -> bytes:
    value = message.get("data")
    if not isinstance(value, str):
        raise BadSessionMessage(f"{message.get('type')} carries no data")
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BadSessionMessage(f"{message.get('type')}'s data is not base64") from None
    if len(data) > MAX_DATA:
        raise BadSessionMessage(f"{message.get('type')} carries more than {MAX_DATA} bytes")
    return data


def encode_data(data: bytes) -> str:
    return base64.b64encode(data).decode()


@dataclass(frozen=True)
class WindowSize:
    rows: int
    cols: int

    @classmethod
    def of(cls, message: dict[str, Any]) -> WindowSize:
        rows, cols = message.get("rows"), message.get("cols")
        for value in (rows, cols):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= MAX_SIDE:
                raise BadSessionMessage(f"{message.get('type')} has no valid window size")
        assert isinstance(rows, int) and isinstance(cols, int)
        return cls(rows, cols)

    def fields(self) -> dict[str, int]:
        return {"rows": self.rows, "cols": self.cols}


def command_of(message: dict[str, Any]) -> list[str]:
    value = message.get("command")
    if (
        not isinstance(value, list)
        or not value
        or not all(isinstance(a, str) and "\0" not in a for a in value)
        or sum(len(a) for a in value) > MAX_COMMAND
    ):
        raise BadSessionMessage(f"{message.get('type')} has no valid command")
    return list(value)


def exit_code_of(message: dict[str, Any]) -> int:
    value = message.get("code")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 255:
        raise BadSessionMessage(f"{message.get('type')} has no exit code 0-255")
    return value


def grant_fields(session: str, command: list[str]) -> dict[str, Any]:
    """What a session's grant signs besides the cluster, tenant and node: the attempt
    grant's format (oz0_common/attempt_grant.py), the session as a job of one attempt,
    with no environment, limits or timeout: so a node checks it as it checks an attempt's
    (oz0_node/jobs/grants.py), and runs it at most once."""
    return {
        "job_id": session,
        "attempt": 1,
        "command": command,
        "env": {},
        "secrets": None,
        "limits": None,
        "timeout": None,
    }
