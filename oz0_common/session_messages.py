"""The session messages, typed once for the three ends that speak them (docs/sessions.md):
the CLI and the management API (a websocket on 8443), the edge and the node (the node's
control stream).

On the control stream (each names its session, `session`):
- edge → node: `session_open` (its grant, command, window size, and its `Mode`: a PTY or
  pipes, stdin or none, a named user), `session_input` (bytes, base64; `eof` true: the
  person's stdin has ended), `session_resize` (rows, cols), `session_close` (why);
- node → edge: `session_started` (who it runs as), `session_refused` (why),
  `session_output` (bytes, base64; `stream` "stderr" for a command's stderr without a
  PTY, else none), `session_exit` (its exit code).

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
# What an account's name may be (useradd's rule, and no longer than Linux allows).
USER_NAME = re.compile(r"[a-z_][a-z0-9_.-]{0,31}\$?\Z", re.IGNORECASE)
STDERR = "stderr"
STDIN = "stdin"
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
    if not isinstance(value, str) or not SESSION_ID.fullmatch(value):
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


@dataclass(frozen=True)
class Mode:
    """How a session runs: on a PTY (TTY), or with pipes, its stdout and stderr apart and
    its stdin a pipe (STDIN) or /dev/null; as USER (an account the node allows) or, None,
    as a UID of its own. An `open` without these fields is a PTY as its own UID."""

    tty: bool = True
    stdin: bool = False
    user: str | None = None

    @classmethod
    def of(cls, message: dict[str, Any]) -> Mode:
        tty, stdin, user = (
            message.get("tty", True),
            message.get("stdin", False),
            message.get("user"),
        )
        if not isinstance(tty, bool) or not isinstance(stdin, bool):
            raise BadSessionMessage(f"{message.get('type')}'s tty and stdin are true or false")
        if user is not None and (not isinstance(user, str) or not USER_NAME.fullmatch(user)):
            raise BadSessionMessage(f"{message.get('type')} names no valid user")
        return cls(tty, stdin, user)

    def fields(self) -> dict[str, Any]:
        return {"tty": self.tty, "stdin": self.stdin, "user": self.user}


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


def grant_fields(session: str, command: list[str], user: str | None = None) -> dict[str, Any]:
    """What a session's grant signs besides the cluster, tenant and node: the attempt
    grant's format (oz0_common/attempt_grant.py), the session as a job of one attempt,
    with no environment, limits or timeout, and the USER it runs as when it names one: so a
    node checks it as it checks an attempt's (oz0_node/jobs/grants.py), and runs it at
    most once."""
    return {
        "user": user,
        "job_id": session,
        "attempt": 1,
        "command": command,
        "env": {},
        "secrets": None,
        "limits": None,
        "timeout": None,
    }
