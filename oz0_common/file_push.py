"""A file push's part as the cluster signs it and the node runs it (docs/files.md).

A push is a job whose command is PUSH and the push's order: the blob's SHA-256 and size,
the destination, its mode and owner. The command is what an attempt's grant signs
(oz0_common/attempt_grant.py), so the SHA-256 the node checks the content against is one
the cluster CA signed, whichever edge serves the bytes. The node's agent runs such a part
itself (oz0_node/jobs/file_push.py), never as a process: no program named PUSH exists.

Over the node's control stream the agent asks its edge for the blob a piece at a time:
`file_get` {"job", "attempt", "sha256", "offset", "most"}, answered `file_data` {"job",
"attempt", "sha256", "offset", "data": base64 (at most min(most, SERVED_MOST) bytes; without
"most", as an older agent asks, at most SERVED), "size"} or, when the edge will not serve
it, the same with "error" (a line) and no data; "unavailable" (the database away, or the
stream's reads at their cap, READS_PER_STREAM) is asked again. The agent keeps up to
WINDOW pieces asked at once, each of PIECE bytes: a piece's round trip does not pace the
push, and what one push holds in memory, on each side, stays bounded (WINDOW x PIECE).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

PUSH = "@oz0/file-push"
GET = "file_get"
DATA = "file_data"
# How the cluster stores a blob: rows of CHUNK bytes (the last one shorter); uploaded up to
# CHUNKS_PER_UPLOAD rows a request.
CHUNK = 32 << 10
# What one file_data carries at most when the node does not say (an older agent): a row.
SERVED = CHUNK
# What it carries at most when the node asks for more ("most"): 8 rows, 341 KiB of base64,
# well inside the 1 MiB a message the agent's websocket takes.
SERVED_MOST = 8 * CHUNK
# What the agent asks for in one file_get, and how many it keeps asked at once.
PIECE = SERVED_MOST
WINDOW = 4
# The edge reads at most this many pieces at once for one stream; a file_get past that is
# answered "unavailable" (asked again), never queued (docs/node-protocol.md).
READS_PER_STREAM = WINDOW
# A chunk upload (POST /api/v1/files/<sha256>/chunks) carries up to this many consecutive
# rows (its body, base64, within the route's own limit: oz0/server/management.py).
CHUNKS_PER_UPLOAD = 32
DEFAULT_MODE = 0o644
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_OWNER = re.compile(r"^[a-z_][a-z0-9_.-]{0,31}$|^[0-9]{1,10}$")
MAX_PATH = 4096


class BadPush(ValueError):
    """A push's order that is not one; the message is the one line said."""


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and _SHA256.fullmatch(value) is not None


@dataclass(frozen=True)
class PushOrder:
    sha256: str
    size: int
    dest: str
    mode: int = DEFAULT_MODE
    # A user name or UID; None: the agent's own.
    owner: str | None = None

    def __post_init__(self) -> None:
        if not is_sha256(self.sha256):
            raise BadPush("a push names its content by SHA-256 (64 hexadecimal digits)")
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 0:
            raise BadPush("a push's size is a whole number of bytes")
        check_dest(self.dest)
        if not 0 <= self.mode <= 0o7777:
            raise BadPush(f"invalid mode {self.mode:o}: give an octal mode such as 0644")
        if self.owner is not None and not _OWNER.fullmatch(self.owner):
            raise BadPush(f"invalid owner {self.owner!r}: give a user name or a UID")

    def command(self) -> list[str]:
        return [PUSH, self.sha256, str(self.size), self.dest, f"{self.mode:04o}", self.owner or ""]

    @classmethod
    def of(cls, command: Sequence[object]) -> PushOrder | None:
        """The order COMMAND carries; None if it is no push; BadPush if malformed."""
        if not command or command[0] != PUSH:
            return None
        if len(command) != 6 or not all(isinstance(a, str) for a in command):
            raise BadPush(f"a {PUSH} command has 5 arguments")
        _, sha, size, dest, mode, owner = (str(a) for a in command)
        if not size.isdigit() or not re.fullmatch(r"[0-7]{3,4}", mode):
            raise BadPush(f"a {PUSH} command's size or mode is not one")
        return cls(sha, int(size), dest, int(mode, 8), owner or None)


def check_name(name: object) -> str:
    """NAME if it is a plain file's name (`job run --file SRC:NAME`); BadPush if not."""
    if not isinstance(name, str) or not name or "/" in name or "\0" in name:
        raise BadPush(f"a file in the working directory has a plain name, not {name!r}")
    if name in (".", "..") or len(name) > 255:
        raise BadPush(f"a file in the working directory has a plain name, not {name!r}")
    return name


def check_dest(dest: object) -> str:
    """DEST if it is a normal path to a file, absolute or relative to the agent's own
    `files/` directory (each node's its own); BadPush if not."""
    if not isinstance(dest, str) or not dest or len(dest) > MAX_PATH:
        raise BadPush(f"the destination must be a path, not {dest!r}")
    parts = dest.removeprefix("/").split("/")
    if dest.endswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in dest:
        raise BadPush(
            f"the destination {dest!r} must name a file, without '.', '..' or empty parts"
        )
    return dest
