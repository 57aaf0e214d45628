"""`audit follow`: the audit log's stream (GET /api/v1/events, docs/audit-events.md)
printed as it comes, resumed from where it was after a disconnect.

Every line the server sends carries the cursor to resume from (an event's, a keep-alive's,
the stream's last): the follower keeps the latest, and when the stream is lost (the
connection broke, no line came for the keep-alive's interval and READ_SLACK more, the
server ended it) it connects again with `after=` that cursor, to the next server of the
context, so nothing is skipped or printed twice. A line cut off by the disconnect has no
newline and is dropped (the next stream sends it again).

It never waits in silence: each loss and each failed attempt is one line on stderr, the
attempts back off from RETRY_FIRST to RETRY_MOST, and `--give-up-after` ends it (exit 1,
with the cursor to resume from) once no server has answered for that long.

The loop takes the stream's opening as a plain callable, so it is tested with a fake one
(tests/test_audit_events.py also runs it through a real server).
"""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from cli.client import StreamRefused, Unreachable
from oz0.errors import Oz0Error

PATH = "/api/v1/events"
# Past the keep-alive's interval, how long a silent stream is still awaited.
READ_SLACK = 10.0
RETRY_FIRST, RETRY_MOST = 0.5, 10.0
# After a stream that answered ends: a server that ends each at once is not hammered.
RESUME_AFTER = 0.2
# The longest line read (an audit row's details are small; this is a bound, not a size).
MAX_LINE = 4 << 20
# Refusals that pass: the person's streams full (an old one the server has not yet seen
# gone), the server stopping or without its database.
PASSING = frozenset({429, 500, 502, 503, 504})


class Lines(Protocol):
    def readline(self, limit: int) -> bytes: ...

    def close(self) -> None: ...


OpenStream = Callable[[str, str, float], Lines]
"""Open PATH on SERVER with each read bounded by READ_TIMEOUT (server, path, timeout)."""


@dataclass
class Follower:
    open: OpenStream
    # The servers to try, in order (the context's, as it learns them).
    servers: Callable[[], Sequence[str]]
    show: Callable[[dict[str, Any]], None]
    warn: Callable[[str], None]
    kinds: Sequence[str] = ()
    cursor: str | None = None
    keepalive: int = 15
    give_up_after: float | None = None
    # Called with each new cursor, once what came before it is printed (`--cursor-file`).
    save: Callable[[str], None] | None = None
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    _turn: int = field(default=0, init=False)
    # Inside the printing of a line and the saving of its cursor; a stop asked meanwhile.
    _inside: bool = field(default=False, init=False)
    _stop_asked: bool = field(default=False, init=False)

    def interrupt(self, signum: int, frame: object) -> None:
        """SIGINT's and SIGTERM's handler while following: a line being printed has its
        cursor saved first, so a stop never leaves a printed line to come again."""
        if self._inside:
            self._stop_asked = True
        else:
            raise KeyboardInterrupt

    def path(self) -> str:
        query: list[tuple[str, str]] = [("keepalive", str(self.keepalive))]
        if self.cursor is not None:
            query.append(("after", self.cursor))
        query += [("kind", kind) for kind in self.kinds]
        return f"{PATH}?{urllib.parse.urlencode(query)}"

    def run(self) -> None:
        """Follow until interrupted, or until no server answered for give_up_after."""
        failing_since: float | None = None
        delay = RETRY_FIRST
        while True:
            servers = list(self.servers())
            if not servers:
                raise Oz0Error("the context names no server")
            server = servers[self._turn % len(servers)]
            why = self._follow_one(server)
            if why is None:
                # It answered: the next loss starts the count again.
                failing_since, delay = None, RETRY_FIRST
                self.sleep(RESUME_AFTER)
                continue
            self._turn += 1
            now = self.clock()
            failing_since = now if failing_since is None else failing_since
            if self.give_up_after is not None and now - failing_since >= self.give_up_after:
                raise Oz0Error(
                    f"no server answered for {self.give_up_after:g} s ({why}); {self.resume()}"
                )
            self.warn(f"audit follow: {why}; trying again in {delay:g} s")
            self.sleep(delay)
            delay = min(delay * 2, RETRY_MOST)

    def _follow_one(self, server: str) -> str | None:
        """Read one stream of SERVER to its end: None if it answered (and then ended or
        was lost, said on stderr), else why it could not be had."""
        try:
            stream = self.open(server, self.path(), self.keepalive + READ_SLACK)
        except StreamRefused as e:
            if e.status not in PASSING:
                raise
            return f"{server} refused the stream: {e}"
        except Unreachable as e:
            return str(e)
        try:
            lost = self._read(stream)
        finally:
            stream.close()
        after = f" from cursor {self.cursor}" if self.cursor else ""
        self.warn(f"audit follow: {server}: {lost}; resuming{after}")
        # A server that ended its stream (stopping, say) is left for the next one.
        self._turn += 1
        return None

    def _read(self, stream: Lines) -> str:
        """Print STREAM's events until it ends: why it did."""
        while True:
            try:
                raw = stream.readline(MAX_LINE)
            except TimeoutError:
                return f"no line for {self.keepalive + READ_SLACK:g} s"
            except OSError as e:
                return f"the connection broke ({e.strerror or e})"
            except http.client.HTTPException as e:  # a chunked answer cut mid-chunk
                return f"the answer broke off ({type(e).__name__})"
            if not raw.endswith(b"\n"):
                return "the stream was cut off" if raw else "the connection closed"
            try:
                line = json.loads(raw)
            except ValueError:
                return "the server sent a line that is not JSON"
            if not isinstance(line, dict):
                return "the server sent a line that is not a JSON object"
            self._inside = True
            try:
                if "action" in line:
                    self.show(line)
                cursor = line.get("cursor")
                if isinstance(cursor, str) and cursor != self.cursor:
                    self.cursor = cursor
                    if self.save is not None:
                        self.save(cursor)
            finally:
                self._inside = False
            if self._stop_asked:
                raise KeyboardInterrupt
            if "end" in line:
                return f"the server ended the stream ({line['end']})"

    def resume(self) -> str:
        """What to run to go on from here."""
        if self.cursor is None:
            return "no cursor yet"
        return f"resume with --after {self.cursor}"


# A cursor of ours is well under this (base64 of a small JSON object).
_MAX_CURSOR = 512


def read_cursor_file(path: Path) -> str | None:
    """The cursor `--cursor-file` holds (None: no file yet); Oz0Error if it holds none."""
    try:
        text = path.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        raise Oz0Error(f"cannot read the cursor file {path}: {e}") from None
    if not text or len(text) > _MAX_CURSOR or any(c.isspace() for c in text):
        raise Oz0Error(f"{path} holds no cursor (remove it to start from now)")
    return text


def cursor_saver(path: Path) -> Callable[[str], None]:
    """Save each cursor to PATH (mode 0600), replacing it whole: a crash leaves the last
    one or the one before, never half of one."""

    def save(cursor: str) -> None:
        part = path.with_name(path.name + ".part")
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="ascii") as out:
                out.write(cursor + "\n")
            part.replace(path)
        except OSError as e:
            raise Oz0Error(f"cannot save the cursor to {path}: {e.strerror or e}") from None

    return save
