"""Printing data for people (aligned columns) and for scripts (--json).

What people read is escaped (`terminal_safe`): a node names itself, and a hostname or a
label holding an escape sequence must not drive the operator's terminal. JSON needs no
such care; `json.dumps` escapes every control character already.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def terminal_safe(value: object) -> str:
    """VALUE as text with every character that is not printable written as an escape.

    Not printable (`str.isprintable`): C0 and C1 controls, DEL, format characters (bidi
    overrides and isolates, zero-width ones), line and paragraph separators, surrogates,
    private-use and unassigned code points. The space stays; a tab or a newline does not.
    """
    text = "" if value is None else str(value)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else _escape(c) for c in text)


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[terminal_safe(h) for h in headers]] + [[terminal_safe(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def print_fields(fields: Sequence[tuple[str, Any]]) -> None:
    """NAME: VALUE lines, values aligned and escaped."""
    width = max((len(name) for name, _ in fields), default=0) + 1
    for name, value in fields:
        print(f"{name + ':':<{width}} {terminal_safe(value)}")


def warn(message: str) -> None:
    print(terminal_safe(message), file=sys.stderr)
