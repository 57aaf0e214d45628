"""`job run --output MODE`: how the output of many nodes is laid out.

- `raw` (the default, as before): each piece of output as it comes, byte for byte.
- `prefixed`: each line behind its node's ID (`node-0123456789ab: text`), as pdsh and
  `salt --out=txt` do; a line is written once it is whole (or its attempt has ended), so
  lines of different nodes never mix within a line.
- `grouped`: each attempt's output as one block when it ends, under a line naming its node
  and how it ended (`--- node-0123456789ab: exit code 0`), as `dshbak` does.

In `prefixed` and `grouped` the output is text: each line is read as UTF-8 (a byte that is
not shown as `\\xNN`) and every character that could drive a terminal is escaped
(cli/output.py terminal_safe; a tab stays), so that no node's output can forge another's
prefix or header. `raw` is the one for bytes as they are.

Each mode turns what the follower gives it into WRITES, (stream, bytes) in order: what
the command wrote to stdout goes to stdout, to stderr to stderr; our own lines (notes,
and `grouped`'s headers on stdout, so that `> file` keeps each block whole) are added.
Pure: nothing here writes (cli/job_screen.py does).
"""

from __future__ import annotations

from typing import Literal, Protocol

from cli.output import terminal_safe

STDOUT, STDERR = "stdout", "stderr"
Write = tuple[str, bytes]
OutputMode = Literal["raw", "prefixed", "grouped"]
# A line longer than this is written in pieces of it: what is held per node stays bounded.
MAX_LINE = 64 * 1024


class Lines(Protocol):
    def output(self, attempt: int, node: str, stream: str, data: bytes) -> list[Write]: ...

    def note(self, text: str, attempt: int | None = None) -> list[Write]:
        """Our own line (a header, a truncation, why the job waits); ATTEMPT: its attempt's."""
        ...

    def ended(self, attempt: int, node: str, how: str) -> list[Write]:
        """ATTEMPT (on NODE) has ended (HOW: `exit code 0`, `node lost`, ...) and all of its
        output has been given: what was held of it."""
        ...

    def finish(self) -> list[Write]:
        """Following stopped: everything still held."""
        ...


def safe_line(raw: bytes) -> str:
    """A line of a node's output (without its newline) as text a terminal only shows."""
    text = raw.decode("utf-8", "backslashreplace")
    if text.endswith("\r"):  # a CRLF line ends as any other
        text = text[:-1]
    return "\t".join(terminal_safe(piece) for piece in text.split("\t"))


def _note(text: str) -> Write:
    return (STDERR, (terminal_safe(text) + "\n").encode())


class Raw:
    """As before: the bytes as they come, our lines on stderr."""

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> list[Write]:
        return [(stream, data)] if data else []

    def note(self, text: str, attempt: int | None = None) -> list[Write]:
        return [_note(text)]

    def ended(self, attempt: int, node: str, how: str) -> list[Write]:
        return []

    def finish(self) -> list[Write]:
        return []


class Dropped(Raw):
    """`--json`: the command's output is left in the cluster (`job logs`); our notes stay."""

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> list[Write]:
        return []


class Prefixed:
    def __init__(self) -> None:
        # What each attempt's stream holds of a line not yet whole.
        self._held: dict[tuple[int, str], bytearray] = {}
        self._nodes: dict[int, str] = {}

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> list[Write]:
        self._nodes[attempt] = node
        held = self._held.setdefault((attempt, stream), bytearray())
        held += data
        writes = []
        start = 0
        while (end := held.find(b"\n", start)) >= 0:
            writes.append(self._line(node, stream, held[start:end]))
            start = end + 1
        del held[:start]
        while len(held) > MAX_LINE:
            writes.append(self._line(node, stream, held[:MAX_LINE]))
            del held[:MAX_LINE]
        return writes

    def note(self, text: str, attempt: int | None = None) -> list[Write]:
        node = self._nodes.get(attempt) if attempt is not None else None
        return [_note(text if node is None else f"{node}: {text}")]

    def ended(self, attempt: int, node: str, how: str) -> list[Write]:
        writes = []
        for stream in (STDOUT, STDERR):
            held = self._held.pop((attempt, stream), None)
            if held:
                writes.append(self._line(self._nodes.get(attempt, node), stream, held))
        return writes

    def finish(self) -> list[Write]:
        held = sorted({attempt for attempt, _ in self._held})
        return [w for attempt in held for w in self.ended(attempt, self._nodes[attempt], "")]

    @staticmethod
    def _line(node: str, stream: str, raw: bytes | bytearray) -> Write:
        return (stream, f"{terminal_safe(node)}: {safe_line(bytes(raw))}\n".encode())


class Grouped:
    def __init__(self) -> None:
        # Each attempt's output in the order it came: (stream, bytes) pieces, each grown in
        # place while its stream goes on.
        self._held: dict[int, list[tuple[str, bytearray]]] = {}
        self._nodes: dict[int, str] = {}

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> list[Write]:
        self._nodes[attempt] = node
        pieces = self._held.setdefault(attempt, [])
        if pieces and pieces[-1][0] == stream:
            pieces[-1][1].extend(data)
        else:
            pieces.append((stream, bytearray(data)))
        return []

    def note(self, text: str, attempt: int | None = None) -> list[Write]:
        if attempt is None or attempt not in self._nodes:
            return [_note(text)]
        stream, line = _note(text)
        self._held.setdefault(attempt, []).append((stream, bytearray(line)))
        return []

    def ended(self, attempt: int, node: str, how: str) -> list[Write]:
        # An attempt that printed nothing has its block too: its node, and how it ended.
        pieces = self._held.pop(attempt, [])
        node = self._nodes.get(attempt, node)
        head = f"--- {node}: {how}" if how else f"--- {node}"
        writes: list[Write] = [(STDOUT, (terminal_safe(head) + "\n").encode())]
        for stream, data in pieces:
            lines = data.split(b"\n")
            if lines[-1] == b"":
                lines.pop()
            text = "".join(safe_line(bytes(line)) + "\n" for line in lines)
            writes.append((stream, text.encode()))
        return writes

    def finish(self) -> list[Write]:
        held = sorted(self._held)
        return [w for attempt in held for w in self.ended(attempt, self._nodes[attempt], "")]


def lines_for(mode: str) -> Lines:
    if mode == "prefixed":
        return Prefixed()
    if mode == "grouped":
        return Grouped()
    return Raw()
