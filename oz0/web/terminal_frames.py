"""What a session's terminal showed over time, from its asciicast v2 recording: its output
events fed to a VT100 emulator (pyte) of the recorded size, resizes followed, as frames
(the lines that changed, at the recorded time) for the web UI's replay
(static/session-replay.js), and its last screen for the page itself.

Bounded, since a session may last hours: the replay covers the first REPLAY_OUTPUT
characters of output (`Events.truncated` says it stopped there; `session play` has it
all), a screen is at most MAX_COLS x MAX_ROWS (a larger one is cut to it), output events
less than FRAME_STEP apart make one frame, and frames come in pages of PAGE_FRAMES frames
or PAGE_TEXT characters of lines at most, each page beginning with the whole screen, so
that one answer is never larger than a page and a screen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyte
from pyte.screens import wcwidth

REPLAY_OUTPUT = 2 * 1024 * 1024
MAX_COLS, MAX_ROWS = 400, 200
# (cols, rows) of a recording whose header has no size.
DEFAULT_SIZE = (80, 24)
FRAME_STEP = 1 / 30
PAGE_FRAMES = 500
PAGE_TEXT = 256 * 1024


class BadRecording(ValueError):
    """A recording that is not asciicast v2 as sessions write it."""


@dataclass
class Events:
    """A recording's header and its output and resize events, as far as the replay goes."""

    cols: int
    rows: int
    # (seconds from the start, "o" or "r", the output's text or "COLSxROWS")
    events: list[tuple[float, str, str]] = field(default_factory=list)
    # The recording has more output than the replay covers.
    truncated: bool = False


def read(lines: Iterable[str], limit: int = REPLAY_OUTPUT) -> Events:
    """The events of an asciicast v2 file given as LINES (or texts of several lines, as
    its chunks are stored), up to LIMIT characters of output: the rest is not read."""
    found: Events | None = None
    output = 0
    for text in lines:
        for line in text.splitlines():
            if not line:
                continue
            try:
                item = json.loads(line)
            except ValueError as e:
                raise BadRecording(f"a line of the recording is not JSON: {e}") from None
            if found is None:
                found = _header(item)
                continue
            at, code, data = _event(item)
            if code == "r":
                found.events.append((at, code, data))
            elif code == "o":
                if output + len(data) > limit:
                    found.events.append((at, code, data[: limit - output]))
                    found.truncated = True
                    return found
                output += len(data)
                found.events.append((at, code, data))
    if found is None:
        raise BadRecording("the recording has no header")
    return found


def _header(item: Any) -> Events:
    if not isinstance(item, dict) or item.get("version") != 2:
        raise BadRecording("the recording's header is not asciicast v2's")
    width, height = item.get("width"), item.get("height")
    if not isinstance(width, int) or not isinstance(height, int) or width < 1 or height < 1:
        # A command run without a terminal of its own: shown as on a common one.
        width, height = DEFAULT_SIZE
    return Events(*_size(width, height))


def _event(item: Any) -> tuple[float, str, str]:
    if (
        not isinstance(item, list)
        or len(item) != 3
        or not isinstance(item[0], int | float)
        or not isinstance(item[1], str)
        or not isinstance(item[2], str)
    ):
        raise BadRecording("an event of the recording is not [time, code, data]")
    return float(item[0]), item[1], item[2]


def _size(cols: int, rows: int) -> tuple[int, int]:
    return max(1, min(cols, MAX_COLS)), max(1, min(rows, MAX_ROWS))


def _resize(text: str) -> tuple[int, int] | None:
    cols, _, rows = text.partition("x")
    try:
        return _size(int(cols), int(rows))
    except ValueError:
        return None


@dataclass(frozen=True)
class Frame:
    """The screen at AT: the LINES that changed (by row, trailing spaces left out), and
    its size when it changed (every line is given then)."""

    at: float
    lines: dict[int, str]
    size: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {"t": round(self.at, 3), "lines": sorted(self.lines.items())}
        if self.size is not None:
            shown["size"] = list(self.size)
        return shown

    @property
    def text(self) -> int:
        return sum(len(line) for line in self.lines.values())


class Terminal:
    """A pyte screen fed a recording's events (Events), frame by frame."""

    def __init__(self, recorded: Events) -> None:
        self.recorded = recorded
        self.screen = pyte.Screen(recorded.cols, recorded.rows)
        self._stream = pyte.Stream(self.screen)

    @property
    def size(self) -> tuple[int, int]:
        return self.screen.columns, self.screen.lines

    def line(self, row: int) -> str:
        """Row ROW as the terminal shows it (a wide character's second cell left out)."""
        cells = self.screen.buffer[row]
        shown: list[str] = []
        wide = False
        for x in range(self.screen.columns):
            if wide:
                wide = False
                continue
            char = cells[x].data
            if not char:  # the second half of a wide character whose first was overwritten
                shown.append(" ")
                continue
            wide = wcwidth(char[0]) == 2
            shown.append(char)
        return "".join(shown)

    def lines(self) -> list[str]:
        return [self.line(row) for row in range(self.screen.lines)]

    def whole(self, at: float) -> Frame:
        """The screen as it is now, every line, as a frame at AT."""
        return Frame(at, {row: self.line(row).rstrip() for row in range(self.screen.lines)},
                     self.size)  # fmt: skip

    def _apply(self, code: str, data: str) -> bool:
        """Feed one event; whether the screen's size changed."""
        if code == "o":
            self._stream.feed(data)
            return False
        size = _resize(data)
        if size is None or size == self.size:
            return False
        self.screen.resize(lines=size[1], columns=size[0])
        return True

    def play(self) -> None:
        """Every event: the screen is then the last one."""
        for _, code, data in self.recorded.events:
            self._apply(code, data)

    def frames(self) -> Iterator[Frame]:
        """The blank screen at 0, then one frame per FRAME_STEP or less of events that
        changed the screen. When one is yielded, the screen is as it shows."""
        yield self.whole(0.0)
        self.screen.dirty.clear()
        began: float | None = None
        last = 0.0
        resized = False
        for at, code, data in self.recorded.events:
            if began is not None and at - began >= FRAME_STEP:
                yield from self._frame(last, resized)
                began, resized = None, False
            resized = self._apply(code, data) or resized
            if began is None:
                began = at
            last = at
        if began is not None:
            yield from self._frame(last, resized)

    def _frame(self, at: float, resized: bool) -> Iterator[Frame]:
        if resized:
            self.screen.dirty.clear()
            yield self.whole(at)
            return
        rows = sorted(row for row in self.screen.dirty if row < self.screen.lines)
        self.screen.dirty.clear()
        if rows:
            yield Frame(at, {row: self.line(row).rstrip() for row in rows})


@dataclass(frozen=True)
class Page:
    """Page NUMBER of a replay's frames (its first, the whole screen); NEXT: the next
    page's number, None if this is the last."""

    number: int
    cols: int
    rows: int
    frames: list[Frame]
    next: int | None
    truncated: bool

    def to_json(self) -> dict[str, Any]:
        return {
            "page": self.number,
            "cols": self.cols,
            "rows": self.rows,
            "frames": [f.to_json() for f in self.frames],
            "next": self.next,
            "truncated": self.truncated,
        }


def page(recorded: Events, number: int) -> Page | None:
    """Page NUMBER of RECORDED's frames (None: there is no such page). Pages are cut where
    PAGE_FRAMES or PAGE_TEXT is reached, the same way whichever page is asked for; the
    events after the page asked for are not fed to the emulator."""
    terminal = Terminal(recorded)
    current, count, text = 0, 0, 0
    taken: list[Frame] = []
    for frame in terminal.frames():
        if count and (count >= PAGE_FRAMES or text + frame.text > PAGE_TEXT):
            if current == number:
                return Page(number, *_first_size(recorded), taken, number + 1,
                            recorded.truncated)  # fmt: skip
            current, count, text = current + 1, 0, 0
        count += 1
        text += frame.text
        if current == number:
            # A page begins with the whole screen: it plays without the pages before it.
            taken.append(terminal.whole(frame.at) if count == 1 else frame)
    if current == number and taken:
        return Page(number, *_first_size(recorded), taken, None, recorded.truncated)
    return None


def _first_size(recorded: Events) -> tuple[int, int]:
    return recorded.cols, recorded.rows


def last_screen(recorded: Events) -> list[str]:
    """The screen as the recording (as far as the replay goes) left it: every line, each
    as wide as the screen."""
    terminal = Terminal(recorded)
    terminal.play()
    return terminal.lines()
