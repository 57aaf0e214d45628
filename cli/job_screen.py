"""Writing a followed job's output with a status line on stderr.

LIVE (stderr is a terminal): one line, redrawn in place with a carriage return, as Salt's
`--progress` does. It is wiped before anything else is written and drawn again after, and
only at the start of a line: a node's output that ends mid-line is never cut by it. No
escape sequence is used (spaces wipe it), so any terminal shows it right; it is cut to the
terminal's width, as a line that wrapped could not be redrawn.

LINES (`--progress` where stderr is not a terminal): the line again, whole, each time it
changes, for a log to keep. OFF: no status line.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from cli.job_lines import STDERR, STDOUT, Write

LIVE, LINES, OFF = "live", "lines", "off"
DEFAULT_COLUMNS = 80


def is_terminal(stream: Any) -> bool:
    """Whether STREAM (sys.stderr, or what a test put there) is a terminal."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def columns_of(stream: BinaryIO) -> Callable[[], int]:
    def columns() -> int:
        try:
            return os.get_terminal_size(stream.fileno()).columns or DEFAULT_COLUMNS
        except (AttributeError, ValueError, OSError):
            return DEFAULT_COLUMNS

    return columns


class Screen:
    def __init__(
        self,
        out: BinaryIO,
        err: BinaryIO,
        *,
        status: str,
        out_on_terminal: bool,
        columns: Callable[[], int] = lambda: DEFAULT_COLUMNS,
    ) -> None:
        self.out, self.err, self.mode = out, err, status
        # Whether stdout is the terminal the live line is on (its lines then count too).
        self.out_on_terminal = out_on_terminal
        self.columns = columns
        self._text: str | None = None  # the status to show
        self._drawn = 0  # the width of the status on the terminal now (0: none)
        self._last_line: str | None = None  # LINES: the last one written
        # Whether each stream's last byte written ended a line.
        self._whole = {STDOUT: True, STDERR: True}

    def write(self, writes: Sequence[Write]) -> None:
        writes = [(stream, data) for stream, data in writes if data]
        if not writes:
            return
        self._wipe()
        for stream, data in writes:
            target = self.out if stream == STDOUT else self.err
            target.write(data)
            target.flush()  # each at once: the two streams keep their order on a terminal
            self._whole[stream] = data.endswith(b"\n")
        self._draw()

    def status(self, text: str) -> None:
        if self.mode == LINES:
            if text != self._last_line and self._at_line_start():
                self._last_line = text
                self.err.write(text.encode() + b"\n")
                self.err.flush()
        elif self.mode == LIVE and text != self._text:
            self._text = text
            self._wipe()
            self._draw()

    def clear(self) -> None:
        """Wipe the live line for good, and end a line a node left unended on the terminal:
        what we print next (the recap, or any last words) starts a line of its own."""
        self._wipe()
        self._text = None
        if self.mode == LIVE and not self._at_line_start():
            self.err.write(b"\n")
            self.err.flush()
            self._whole = {STDOUT: True, STDERR: True}

    def _at_line_start(self) -> bool:
        if self.mode == LIVE and not self.out_on_terminal:
            return self._whole[STDERR]
        return self._whole[STDERR] and self._whole[STDOUT]

    def _wipe(self) -> None:
        if self._drawn:
            self.err.write(b"\r" + b" " * self._drawn + b"\r")
            self.err.flush()
            self._drawn = 0

    def _draw(self) -> None:
        if self.mode != LIVE or not self._text or not self._at_line_start():
            return
        line = self._text[: max(self.columns() - 1, 1)]
        self.err.write(b"\r" + line.encode())
        self.err.flush()
        self._drawn = len(line)
