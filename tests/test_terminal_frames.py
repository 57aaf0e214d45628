"""A session's recording as its terminal showed it (oz0/web/terminal_frames.py), without a
browser: a carriage return overwrites, an erase clears, a resize resizes; frames come at
the recorded times, pages of them compose to the last screen, and what one answer holds
and what is read of a long recording are bounded."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from oz0.web import terminal_frames as tf


def cast(width: int, height: int, *events: tuple[float, str, str]) -> list[str]:
    header = {"version": 2, "width": width, "height": height, "env": {"TERM": "xterm"}}
    return [json.dumps(header) + "\n", *(json.dumps(list(e)) + "\n" for e in events)]


def played(pages: list[tf.Page]) -> list[str]:
    """The screen a player (as session-replay.js) shows after PAGES, lines as wide as it."""
    lines: list[str] = []
    cols = 0
    for page in pages:
        for frame in page.frames:
            if frame.size is not None:
                cols = frame.size[0]
                lines = (lines + [""] * frame.size[1])[: frame.size[1]]
            for row, line in frame.lines.items():
                lines[row] = tf.text_of(line)
    return [line.ljust(cols) for line in lines]


def all_pages(recorded: tf.Events) -> list[tf.Page]:
    pages: list[tf.Page] = []
    number: int | None = 0
    while number is not None:
        page = tf.page(recorded, number)
        assert page is not None
        pages.append(page)
        number = page.next
    return pages


def test_the_screen_is_what_a_terminal_shows_not_the_text_written() -> None:
    recorded = tf.read(
        cast(
            20, 4,
            (0.25, "o", "abc"),
            (0.5, "o", "\rX\r\n"),
            (1.0, "i", "ignored input"),
            (1.5, "o", "hello\x1b[2J\x1b[Hworld"),
            (2.0, "o", "\x1b[3;5H\x1b[1;31mred\x1b[0m"),
        )
    )  # fmt: skip
    screen = tf.last_screen(recorded)
    assert screen == ["world".ljust(20), " " * 20, "    red".ljust(20), " " * 20]
    [page] = all_pages(recorded)
    assert [f.at for f in page.frames] == [0.0, 0.25, 0.5, 1.5, 2.0]
    blank, first, overwritten, cleared, moved = page.frames
    assert (blank.size, blank.lines) == ((20, 4), {0: "", 1: "", 2: "", 3: ""})
    assert first.lines == {0: "abc"}
    assert overwritten.lines == {0: "Xbc"}
    assert cleared.lines[0] == "world" and "hello" not in json.dumps(page.to_json())
    assert moved.lines == {2: [("    ", ""), ("red", "fg-red b")]}
    assert played([page]) == screen


def test_a_resize_changes_the_screen_s_size_and_gives_every_line() -> None:
    recorded = tf.read(
        cast(10, 2, (0.1, "o", "0123456789"), (0.5, "r", "6x3"), (0.9, "o", "\r\nnext"))
    )
    [page] = all_pages(recorded)
    resized = page.frames[2]
    assert resized.size == (6, 3)
    assert set(resized.lines) == {0, 1, 2}
    assert tf.last_screen(recorded) == ["012345", "next  ", "      "]
    assert played([page]) == tf.last_screen(recorded)


def test_output_close_together_makes_one_frame() -> None:
    recorded = tf.read(
        cast(10, 2, (0.1, "o", "a"), (0.11, "o", "b"), (0.12, "o", "c"), (0.5, "o", "d"))
    )
    [page] = all_pages(recorded)
    assert [(f.at, f.lines) for f in page.frames[1:]] == [(0.12, {0: "abc"}), (0.5, {0: "abcd"})]


def test_pages_are_bounded_begin_with_the_whole_screen_and_compose_to_the_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tf, "PAGE_FRAMES", 4)
    monkeypatch.setattr(tf, "PAGE_CELLS", 36)
    events = [(i * 0.1, "o", f"line {i}\r\n") for i in range(1, 30)]
    recorded = tf.read(cast(12, 5, *events))
    pages = all_pages(recorded)
    assert len(pages) > 3
    for page in pages:
        assert len(page.frames) <= 4
        # Its frames but the first (the whole screen, 12 x 5 at most) within PAGE_CELLS.
        assert sum(len(f.lines) * 12 for f in page.frames[1:]) <= 36
        first = page.frames[0]
        assert first.size == (12, 5) and set(first.lines) == set(range(5))
    assert pages[-1].next is None
    assert played(pages) == tf.last_screen(recorded)
    # A page alone (the last) shows the same: its first frame is the whole screen.
    assert played(pages[-1:]) == tf.last_screen(recorded)
    times = [f.at for page in pages for f in page.frames]
    assert times == sorted(times)
    assert tf.page(recorded, len(pages)) is None


def test_a_long_recording_is_read_only_as_far_as_the_replay_goes() -> None:
    def lines() -> Iterator[str]:
        yield from cast(80, 24, *((i, "o", "x" * 1000) for i in range(10)))
        raise AssertionError("read past the replay's limit")

    recorded = tf.read(lines(), limit=4500)
    assert recorded.truncated
    assert sum(len(d) for _, code, d in recorded.events if code == "o") == 4500
    whole = tf.read(cast(80, 24, (0.1, "o", "x" * 1000)), limit=4500)
    assert not whole.truncated


def test_a_huge_window_is_cut_to_the_largest_shown() -> None:
    recorded = tf.read(cast(10_000, 10_000, (0.1, "o", "hi"), (0.2, "r", "9000x9000")))
    assert (recorded.cols, recorded.rows) == (tf.MAX_COLS, tf.MAX_ROWS)
    [page] = all_pages(recorded)
    assert page.frames[-1].at == 0.1  # a resize to the same (cut) size changes nothing
    assert len(tf.last_screen(recorded)) == tf.MAX_ROWS


@pytest.mark.parametrize(
    ("lines", "why"),
    [
        ([], "no header"),
        (["not json\n"], "not JSON"),
        ([json.dumps({"version": 1}) + "\n"], "not asciicast v2"),
        ([json.dumps({"version": 2, "width": 80, "height": 24}) + "\n", "[1, 2]\n"], "time, code"),
    ],
)
def test_what_is_not_a_recording_is_refused(lines: list[str], why: str) -> None:
    with pytest.raises(tf.BadRecording, match=why):
        tf.read(lines)


def test_colours_and_styles_are_classes_and_the_cursor_is_where_the_terminal_had_it() -> None:
    recorded = tf.read(
        cast(
            20, 3,
            # 256 colours' 208 (orange) shown as the nearest of 16; reverse swaps.
            (0.1, "o", "\x1b[1;31mred\x1b[0m \x1b[38;5;196mx\x1b[0m \x1b[7mrv\x1b[0m\r\n"),
            (0.5, "o", "\x1b[4;42mu\x1b[0m ab"),
            (0.9, "o", "\x1b[D"),  # the cursor moves, nothing else
            (1.3, "o", "\x1b[?25l"),  # hidden
        )
    )  # fmt: skip
    [page] = all_pages(recorded)
    blank, first, second, moved, hidden = page.frames
    assert blank.cursor == (0, 0)
    assert first.lines == {
        0: [("red", "fg-red b"), (" ", ""), ("x", "fg-brightred"), (" ", ""),
            ("rv", "fg-bg bg-fg")],
    }  # fmt: skip
    assert first.cursor == (0, 1)
    assert second.lines == {1: [("u", "bg-green u"), (" ab", "")]}
    assert second.cursor == (4, 1)
    assert (moved.lines, moved.cursor) == ({}, (3, 1))
    assert (hidden.lines, hidden.cursor) == ({}, None)
    assert json.loads(json.dumps(first.to_json()))["lines"][0][1][0] == ["red", "fg-red b"]
    # The page's grid: each line as wide as the screen, the cursor's character its own.
    shown = tf.html_lines(tf.last_frame(tf.read(cast(6, 2, (0.1, "o", "ab\x1b[D")))))
    assert shown == [[("a", ""), ("b", "cursor"), ("    ", "")], [("      ", "")]]
