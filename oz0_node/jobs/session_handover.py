"""What the agent and a session's supervisor exchange, defined once for both sides (the
agent's, session_client.py; the supervisor's process, session_process.py).

A session runs under a supervisor of its own, as an attempt does (supervisor.py), forked by
the agent's launcher (launcher.py): never by the agent itself, which runs threads. Its
directory is DATA_DIR/sessions/<session> (0700): `lock` (held by the supervisor for its
whole life), `supervisor.json`, `tracking.json` and `supervisor.log`, as an attempt's
(attempt_files.py). The supervisor removes it when the session is over; one left behind
(the supervisor killed) is ended by the next look (`end_leftovers`) and removed.

The session comes over a pipe (`SessionSpec`, JSON), as an attempt does. The two then
talk over a Unix socket (SOCK_SEQPACKET: one JSON object a message), the agent's end of it
being the one the supervisor's first process says FORKED on:

- supervisor → agent: `{"started": USER}` with the descriptors the agent reads and writes
  attached (SCM_RIGHTS): the PTY's master side, or the command's stdout and stderr pipes
  and, when it has one, its stdin's; or `{"refused": WHY}`; then `{"exit": CODE}` once the
  command has exited; then `{"ended": APPLIED}` once nothing of the session is left.
- agent → supervisor: `{"hangup": true}` (the person closed it: SIGHUP to its processes);
  `{"end": true}` (end it now: what is left is ended, its UID swept). The agent's end of the
  socket closing (the agent gone, however) means the same: a session lives no longer than
  its agent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oz0_common import json_object
from oz0_node.jobs.isolation import Isolation

SESSIONS_DIR = "sessions"
# The largest message either side sends (a spec goes over its pipe, not the socket).
MAX_MESSAGE = 64 * 1024
# What a session's descriptors are, in the order they are attached to `started`.
PTY_FDS = ("pty",)
PIPE_FDS = ("stdout", "stderr")
STDIN_FD = "stdin"


def sessions_root(data_dir: Path) -> Path:
    return data_dir / SESSIONS_DIR


@dataclass(frozen=True)
class SessionSpec:
    """One session as the agent hands it to its supervisor."""

    node_id: str
    session: str
    command: tuple[str, ...]
    term: str | None  # TERM (a terminal's), None without one
    tty: bool  # a PTY (else pipes: stdout and stderr apart)
    stdin: bool  # without a PTY: whether it has a stdin pipe (else /dev/null)
    rows: int
    cols: int
    user: str | None  # an account the node allows (--session-users); None: its own UID

    def to_dict(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "session": self.session,
            "command": list(self.command),
            "term": self.term,
            "tty": self.tty,
            "stdin": self.stdin,
            "rows": self.rows,
            "cols": self.cols,
            "user": self.user,
        }

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SessionSpec:
        return cls(
            node_id=str(raw["node_id"]),
            session=str(raw["session"]),
            command=tuple(str(a) for a in raw["command"]),
            term=raw["term"] if isinstance(raw["term"], str) else None,
            tty=bool(raw["tty"]),
            stdin=bool(raw["stdin"]),
            rows=int(raw["rows"]),
            cols=int(raw["cols"]),
            user=raw["user"] if isinstance(raw["user"], str) else None,
        )


def handover(spec: SessionSpec, isolation: Isolation, directory: Path, lock: int) -> bytes:
    """What the agent writes to the supervisor's pipe (trusted: the agent's own, of the
    same code; `parse_handover`)."""
    raw = {
        "dir": str(directory),
        "lock_fd": lock,
        "spec": spec.to_dict(),
        "isolation": isolation.handed(),
    }
    return json.dumps(raw).encode()


def parse_handover(raw: dict[str, Any]) -> tuple[SessionSpec, Isolation, Path, int]:
    return (
        SessionSpec.from_dict(raw["spec"]),
        Isolation.from_handed(raw["isolation"]),
        Path(raw["dir"]),
        int(raw["lock_fd"]),
    )


def encode(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def decode(data: bytes) -> dict[str, Any]:
    """A message of the other side; {} when it is not one (logged by the caller)."""
    try:
        return json_object.parse(data)
    except json_object.NotAnObject:
        return {}
