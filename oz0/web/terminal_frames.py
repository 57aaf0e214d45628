"""What a session's terminal showed over time, from its asciicast v2 recording: its output
events fed to a VT100 emulator (pyte) of the recorded size, resizes followed, as frames
(the lines that changed, at the recorded time) for the web UI's replay
(static/session-replay.js), and its last screen for the page itself.

Bounded, since a session may last hours: the replay covers the first REPLAY_OUTPUT
characters of output (`Events.truncated` says it stopped there; `session play` has it
all), a screen is at most MAX_COLS x MAX_ROWS (a larger one is cut to it), output events
less than FRAME_STEP apart make one frame, and frames come in pages of PAGE_FRAMES frames
or PAGE_CELLS cells of changed lines at most, each page beginning with the whole screen,
so that one answer is never larger than a page and a screen. A page is found by feeding
the emulator from the start (pyte does some hundreds of KiB a second) and drawing the
lines of that page's frames only.

A line is its text, or, when anything on it is coloured or styled, runs of (text, CSS
classes): `fg-NAME`/`bg-NAME` of the 16 colours (a colour of the 256 or of 24 bits shown
as the nearest of them: the page's CSP allows no style of its own), `b` bold, `i` italic,
`u` underlined, `s` struck through (reverse swaps the colours). The cursor is where the
terminal had it (a character's place on its row; None when the program hid it).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pyte
from pyte.screens import wcwidth

# pyte feeds some hundreds of KiB a second: about a second of a core, at most.
REPLAY_OUTPUT = 512 * 1024
MAX_COLS, MAX_ROWS = 400, 200
# (cols, rows) of a recording whose header has no size.
DEFAULT_SIZE = (80, 24)
FRAME_STEP = 1 / 30
PAGE_FRAMES = 500
PAGE_CELLS = 128 * 1024


# A line as shown: its text, or runs of (text, CSS classes) when any of it is styled.
Run = tuple[str, str]
Line = str | list[Run]
# The 16 colours (pyte's names; "brown" is yellow) as xterm draws them, to match those of
# 256 or of 24 bits to the nearest.
PALETTE = {
    "black": (0, 0, 0), "red": (205, 0, 0), "green": (0, 205, 0), "brown": (205, 205, 0),
    "blue": (0, 0, 238), "magenta": (205, 0, 205), "cyan": (0, 205, 205),
    "white": (229, 229, 229), "brightblack": (127, 127, 127), "brightred": (255, 0, 0),
    "brightgreen": (0, 255, 0), "brightbrown": (255, 255, 0), "brightblue": (92, 92, 255),
    "brightmagenta": (255, 0, 255), "brightcyan": (0, 255, 255),
    "brightwhite": (255, 255, 255),
}  # fmt: skip


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


def text_of(line: Line) -> str:
    return line if isinstance(line, str) else "".join(text for text, _ in line)


def _rstrip(runs: list[Run]) -> Line:
    """RUNS without the unstyled spaces at their end; their text alone if none is styled."""
    while runs and not runs[-1][1] and not runs[-1][0].strip():
        runs.pop()
    if runs and not runs[-1][1]:
        runs[-1] = (runs[-1][0].rstrip(), "")
    if all(not classes for _, classes in runs):
        return "".join(text for text, _ in runs)
    return runs


def _nearest(colour: str) -> str:
    """A colour as pyte names it: one of PALETTE's, "default", or 6 hex digits."""
    if colour in PALETTE or colour == "default":
        return colour
    try:
        rgb = (int(colour[0:2], 16), int(colour[2:4], 16), int(colour[4:6], 16))
    except ValueError:
        return "default"

    def distance(name: str) -> int:
        return sum((a - b) ** 2 for a, b in zip(PALETTE[name], rgb, strict=True))

    return min(PALETTE, key=distance)


def classes_of(char: pyte.screens.Char) -> str:
    """The CSS classes a cell is drawn with (none for the terminal's default look)."""
    return _classes(char.fg, char.bg, char.bold, char.italics, char.underscore,
                    char.strikethrough, char.reverse)  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _classes(
    fg: str, bg: str, bold: bool, italics: bool, underscore: bool, strike: bool, reverse: bool
) -> str:
    fg, bg = _nearest(fg), _nearest(bg)
    if reverse:
        # "fg-bg": the terminal's own background colour as a foreground, and so on.
        fg, bg = (bg if bg != "default" else "bg"), (fg if fg != "default" else "fg")
    names = [f"fg-{fg}"] if fg != "default" else []
    names += [f"bg-{bg}"] if bg != "default" else []
    names += [name for name, on in (("b", bold), ("i", italics), ("u", underscore),
              ("s", strike)) if on]  # fmt: skip
    return " ".join(names)


@dataclass(frozen=True)
class Frame:
    """The screen at AT: the LINES that changed (by row, trailing spaces left out), its
    size when it changed (every line is given then), and where its CURSOR is (character,
    row; None: hidden)."""

    at: float
    lines: dict[int, Line]
    size: tuple[int, int] | None = None
    cursor: tuple[int, int] | None = None

    def to_json(self) -> dict[str, Any]:
        shown: dict[str, Any] = {
            "t": round(self.at, 3),
            "lines": [[row, line if isinstance(line, str) else [list(r) for r in line]]
                      for row, line in sorted(self.lines.items())],
            "cursor": list(self.cursor) if self.cursor is not None else None,
        }  # fmt: skip
        if self.size is not None:
            shown["size"] = list(self.size)
        return shown


class Terminal:
    """A pyte screen fed a recording's events (Events), frame by frame."""

    def __init__(self, recorded: Events) -> None:
        self.recorded = recorded
        self.screen = pyte.Screen(recorded.cols, recorded.rows)
        self._stream = pyte.Stream(self.screen)
        self._cursor: tuple[int, int] | None = None

    @property
    def size(self) -> tuple[int, int]:
        return self.screen.columns, self.screen.lines

    def _cells(self, row: int) -> Iterator[tuple[int, pyte.screens.Char]]:
        """Row ROW's cells as the terminal shows them, with their columns: a wide
        character's second cell left out."""
        cells = self.screen.buffer[row]
        wide = False
        for x in range(self.screen.columns):
            if wide:
                wide = False
                continue
            char = cells[x]
            if not char.data:  # the second half of a wide character overwritten
                yield x, char._replace(data=" ")
                continue
            wide = wcwidth(char.data[0]) == 2
            yield x, char

    def line(self, row: int) -> Line:
        """Row ROW as shown (see Line), trailing unstyled spaces left out."""
        runs: list[Run] = []
        for _, char in self._cells(row):
            classes = classes_of(char)
            if runs and runs[-1][1] == classes:
                runs[-1] = (runs[-1][0] + char.data, classes)
            else:
                runs.append((char.data, classes))
        return _rstrip(runs)

    def text(self, row: int) -> str:
        """Row ROW's text, as wide as the screen."""
        return "".join(char.data for _, char in self._cells(row))

    def lines(self) -> list[str]:
        return [self.text(row) for row in range(self.screen.lines)]

    def cursor(self) -> tuple[int, int] | None:
        """Where the cursor is: its character's place on its row (a wide character
        before it counts one), and the row; None when hidden."""
        cursor = self.screen.cursor
        if cursor.hidden or not 0 <= cursor.y < self.screen.lines:
            return None
        place = sum(1 for x, _ in self._cells(cursor.y) if x < cursor.x)
        return place, cursor.y

    def whole(self, at: float) -> Frame:
        """The screen as it is now, every line, as a frame at AT."""
        lines = {row: self.line(row) for row in range(self.screen.lines)}
        return Frame(at, lines, self.size, self.cursor())

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

    def changes(self) -> Iterator[Change]:
        """The blank screen at 0, then one change per FRAME_STEP or less of events that
        changed the screen or moved the cursor. When one is yielded, the screen is as it
        leaves it (`frame` draws it)."""
        yield Change(0.0, list(range(self.screen.lines)), self.size, self.cursor())
        self.screen.dirty.clear()
        self._cursor = self.cursor()
        began: float | None = None
        last = 0.0
        resized = False
        for at, code, data in self.recorded.events:
            if began is not None and at - began >= FRAME_STEP:
                yield from self._change(last, resized)
                began, resized = None, False
            resized = self._apply(code, data) or resized
            if began is None:
                began = at
            last = at
        if began is not None:
            yield from self._change(last, resized)

    def _change(self, at: float, resized: bool) -> Iterator[Change]:
        cursor = self.cursor()
        if resized:
            self.screen.dirty.clear()
            self._cursor = cursor
            yield Change(at, list(range(self.screen.lines)), self.size, cursor)
            return
        rows = sorted(row for row in self.screen.dirty if row < self.screen.lines)
        self.screen.dirty.clear()
        if rows or cursor != self._cursor:
            self._cursor = cursor
            yield Change(at, rows, None, cursor)

    def frame(self, change: Change) -> Frame:
        """CHANGE drawn, the screen being as it leaves it."""
        return Frame(change.at, {row: self.line(row) for row in change.rows}, change.size,
                     change.cursor)  # fmt: skip

    def frames(self) -> Iterator[Frame]:
        """Every change, drawn."""
        for change in self.changes():
            yield self.frame(change)


@dataclass(frozen=True)
class Change:
    """What a frame will show, before its lines are drawn: the ROWS that changed, the
    screen's SIZE when it changed, the CURSOR."""

    at: float
    rows: list[int]
    size: tuple[int, int] | None
    cursor: tuple[int, int] | None


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
    PAGE_FRAMES or PAGE_CELLS is reached, the same way whichever page is asked for; only
    that page's lines are drawn, and the events after it are not fed to the emulator."""
    terminal = Terminal(recorded)
    current, count, cells = 0, 0, 0
    taken: list[Frame] = []
    for change in terminal.changes():
        changed = len(change.rows) * terminal.size[0]
        if count and (count >= PAGE_FRAMES or cells + changed > PAGE_CELLS):
            if current == number:
                return Page(number, *_first_size(recorded), taken, number + 1,
                            recorded.truncated)  # fmt: skip
            current, count, cells = current + 1, 0, 0
        count += 1
        cells += changed
        if current == number:
            # A page begins with the whole screen: it plays without the pages before it.
            taken.append(terminal.whole(change.at) if count == 1 else terminal.frame(change))
    if current == number and taken:
        return Page(number, *_first_size(recorded), taken, None, recorded.truncated)
    return None


def _first_size(recorded: Events) -> tuple[int, int]:
    return recorded.cols, recorded.rows


def last_screen(recorded: Events) -> list[str]:
    """The text of the screen as the recording (as far as the replay goes) left it: every
    line, each as wide as the screen."""
    terminal = Terminal(recorded)
    terminal.play()
    return terminal.lines()


def last_frame(recorded: Events) -> Frame:
    """The screen as the recording left it, as a frame (every line, styled, its cursor)."""
    terminal = Terminal(recorded)
    terminal.play()
    return terminal.whole(recorded.events[-1][0] if recorded.events else 0.0)


def html_lines(frame: Frame) -> list[list[Run]]:
    """FRAME's lines (a whole one: `last_frame`) as runs of (text, CSS classes), each as
    wide as its screen, the cursor's character in a run of its own with class `cursor`:
    what the page's grid shows (oz0/web/templates/session.html)."""
    cols = frame.size[0] if frame.size is not None else 0
    shown: list[list[Run]] = []
    for row, line in sorted(frame.lines.items()):
        runs = [(line, "")] if isinstance(line, str) else list(line)
        width = len(text_of(runs))
        if frame.cursor is not None and frame.cursor[1] == row:
            runs = _with_cursor(runs, frame.cursor[0])
            width = max(width, frame.cursor[0] + 1)
        if width < cols:
            runs.append((" " * (cols - width), ""))
        shown.append([run for run in runs if run[0]])
    return shown


def _with_cursor(runs: list[Run], place: int) -> list[Run]:
    """RUNS with the character at PLACE (a space past their end) in a run of its own."""
    out: list[Run] = []
    start = 0
    for text, classes in runs:
        end = start + len(text)
        if start <= place < end:
            at = place - start
            out += [(text[:at], classes), (text[at], f"{classes} cursor".strip()),
                    (text[at + 1 :], classes)]  # fmt: skip
        else:
            out.append((text, classes))
        start = end
    if place >= start:
        out += [(" " * (place - start), ""), (" ", "cursor")]
    return out
