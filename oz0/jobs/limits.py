"""A job's resource limits: what `job run --memory ... --cpu ...` asks, checked; and what a
node says it applied to an attempt, kept and shown.

The same dict goes all the way: the API's `limits` object, the jobs row, each attempt's
input to the node (`oz0.job.attempt`, only the keys asked), with sizes in bytes:

    {"memory": int, "cpu": float, "max_processes": int, "max_open_files": int,
     "address_space": int}

The node answers, in the attempt's result, what it could do (best effort: a machine without
a memory controller still runs the job, unlimited there, and says so):

    "applied": {"user": str, "tracking": str, "limits": {NAME: HOW},
                "private_tmp": str, "swept": str}

such as {"memory": "cgroup v1", "max_open_files": "rlimit", "cpu": "not applied: no cpu
controller"}; `private_tmp` and `swept` only for an attempt that ran as a UID of its own
(whether its own /tmp and /var/tmp held, "mount namespace" or "not applied: ...", and what
the sweep of its UID found, "nothing left" or "ended 1 process, removed 2 files"). A node
that says nothing (an older agent) has null stored, shown "not reported".

Only the standard library here: the command line parses sizes with it, and the API, the
workflow's steps and the web UI check and show with it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
# Below these no program starts (a shell alone maps several MiB); above them a limit limits
# nothing a machine has.
MIN_SIZE = 4 * MiB
MAX_SIZE = 1 << 50  # 1 PiB
MIN_CPU, MAX_CPU = 0.01, 1024.0  # cgroup CPU quotas go down to 1 ms per 100 ms period
MAX_PROCESSES = 1 << 22  # the kernel's highest pid_max
MIN_OPEN_FILES = 16  # stdin, stdout, stderr and a few libraries' own
MAX_OPEN_FILES = 1 << 20  # the kernel's default nr_open: higher fails setrlimit
NAMES = ("memory", "cpu", "max_processes", "max_open_files", "address_space")
# How `job show` names each, in this order.
_SHOWN = {
    "memory": "memory",
    "cpu": "cpu",
    "max_processes": "processes",
    "max_open_files": "open files",
    "address_space": "address space",
}
# What a node may say it applied, kept as text of at most this length (a node is not
# trusted to keep it short or printable).
MAX_APPLIED_TEXT = 200
NOT_REPORTED = "not reported"
# What a node may say beside its limits, each one line of text, and how `job show` names it.
APPLIED_TEXTS = ("user", "tracking", "private_tmp", "swept")
_SHOWN_APPLIED = {
    "user": "user",
    "tracking": "tracked by",
    "private_tmp": "own /tmp and /var/tmp:",
    "swept": "swept:",
}
# The node answers with its attempt's result, so a running attempt has nothing to show yet.
RUNNING = "running: the node says what it applied when the attempt ends"

_SIZE = re.compile(r"(?P<number>\d+(?:\.\d+)?)\s*(?P<unit>[kmgtp]?)(?:i?b)?", re.IGNORECASE)
_UNIT = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": 1024 * GiB, "p": 1024 * 1024 * GiB}


def parse_size(text: str) -> int:
    """Bytes in TEXT: `1073741824`, `512M`, `2G`, `1.5GiB`, `64MB`; units are powers of
    1024 (K, M, G, T, P, with or without `i` and `B`, any case). ValueError if it is not
    one or is below MIN_SIZE or above MAX_SIZE."""
    match = _SIZE.fullmatch(text.strip())
    if match is None:
        raise ValueError(
            f"invalid size {text!r}: use bytes or a number with K, M, G or T (powers of 1024),"
            " such as 512M, 2G or 1.5GiB"
        )
    size = math.floor(float(match["number"]) * _UNIT[match["unit"].lower()])
    _check_size(size, text)
    return size


def _check_size(size: int, given: object) -> None:
    if not MIN_SIZE <= size <= MAX_SIZE:
        raise ValueError(
            f"invalid size {given!r}: give at least {format_size(MIN_SIZE)} and at most"
            f" {format_size(MAX_SIZE)}"
        )


def parse_cpu(text: str) -> float:
    """A number of CPUs: `0.5`, `2`; from MIN_CPU to MAX_CPU."""
    try:
        cpu = float(text.strip())
    except ValueError:
        cpu = math.nan
    return _cpu(cpu, text)


def _cpu(cpu: float, given: object) -> float:
    if not (math.isfinite(cpu) and MIN_CPU <= cpu <= MAX_CPU):
        raise ValueError(
            f"invalid cpu {given!r}: give a number of CPUs from {MIN_CPU:g} to {MAX_CPU:g},"
            " such as 0.5 or 2"
        )
    return cpu


def _count(value: object, name: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, not {value!r}")
    return value


def check(value: object) -> dict[str, int | float]:
    """The limits an API body asks (`limits`), as the node gets them; ValueError with one
    line naming the wrong one. Sizes may be bytes or text as parse_size reads it."""
    if not isinstance(value, dict):
        raise ValueError(f"limits must be an object with some of: {', '.join(NAMES)}")
    unknown = sorted(set(value) - set(NAMES))
    if unknown:
        raise ValueError(f"unknown limit {unknown[0]!r}: one of {', '.join(NAMES)}")
    checked: dict[str, int | float] = {}
    for name in NAMES:
        given = value.get(name)
        if given is None:
            continue
        try:
            checked[name] = check_one(name, given)
        except ValueError as e:
            raise ValueError(f"limits.{name}: {e}") from None
    return checked


def check_one(name: str, given: object) -> int | float:
    """One limit NAME (of NAMES) as the node gets it; ValueError saying why not."""
    if name in ("memory", "address_space"):
        if isinstance(given, str):
            return parse_size(given)
        if isinstance(given, bool) or not isinstance(given, int):
            raise ValueError(f"invalid size {given!r}: give bytes, or text such as 512M")
        _check_size(given, given)
        return given
    if name == "cpu":
        if isinstance(given, bool) or not isinstance(given, int | float):
            raise ValueError(f"invalid cpu {given!r}: give a number of CPUs, such as 0.5")
        return _cpu(float(given), given)
    if name == "max_processes":
        return _count(given, "max processes", 1, MAX_PROCESSES)
    return _count(given, "max open files", MIN_OPEN_FILES, MAX_OPEN_FILES)


def applied_from_node(value: object) -> dict[str, Any] | None:
    """What a node said it applied, kept to the documented shape (text fields, cut to
    MAX_APPLIED_TEXT, limits by known name); None if it said nothing usable."""
    if not isinstance(value, dict):
        return None
    kept: dict[str, Any] = {}
    for key in APPLIED_TEXTS:
        text = _text(value.get(key))
        if text is not None:
            kept[key] = text
    how = value.get("limits")
    if isinstance(how, dict):
        kept["limits"] = {n: t for n in NAMES if (t := _text(how.get(n))) is not None}
    return kept or None


def _text(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    return "".join(c if c.isprintable() else "?" for c in value[:MAX_APPLIED_TEXT])


def format_size(size: int) -> str:
    """512 MiB, 1.5 GiB, 4096 B: the largest unit the size reaches, up to two decimals."""
    for unit, scale in (("PiB", 1 << 50), ("TiB", 1 << 40), ("GiB", GiB), ("MiB", MiB)):
        if size >= scale:
            return f"{round(size / scale, 2):g} {unit}"
    return f"{size} B"


def _value(name: str, value: object) -> str:
    if name in ("memory", "address_space") and isinstance(value, int):
        return format_size(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def describe(limits: Mapping[str, object]) -> str:
    """The limits asked, on one line: `memory 512 MiB, cpu 0.5`; `none` if none."""
    shown = [f"{_SHOWN[n]} {_value(n, limits[n])}" for n in NAMES if limits.get(n) is not None]
    return ", ".join(shown) or "none"


def describe_applied(asked: Mapping[str, object], applied: Mapping[str, Any] | None) -> str:
    """What a node did for one attempt, on one line: `user uid 61184 (its own), tracked by
    cgroup v2, own /tmp and /var/tmp: mount namespace, swept: nothing left; limits: memory
    512 MiB (cgroup v1), cpu 0.5 (not applied: no cpu controller)`."""
    if applied is None:
        return NOT_REPORTED
    head = ", ".join(f"{_SHOWN_APPLIED[k]} {applied[k]}" for k in APPLIED_TEXTS if applied.get(k))
    how: Mapping[str, str] = applied.get("limits") or {}
    named = [n for n in NAMES if n in asked or n in how]
    if not named:
        return head or NOT_REPORTED
    shown = []
    for name in named:
        value = f" {_value(name, asked[name])}" if name in asked else ""
        shown.append(f"{_SHOWN[name]}{value} ({how.get(name, NOT_REPORTED)})")
    line = "limits: " + ", ".join(shown)
    return f"{head}; {line}" if head else line


def applied_lines(
    asked: Mapping[str, object], attempts: Sequence[tuple[int, bool, Mapping[str, Any] | None]]
) -> list[str]:
    """`attempt N: ...` for each of ATTEMPTS (number, running, applied): what its node
    applied. None at all for a job without limits whose nodes said nothing (older agents):
    shown as before limits existed."""
    if not asked and all(applied is None for _, _, applied in attempts):
        return []
    return [
        f"attempt {number}: "
        + (RUNNING if running and applied is None else describe_applied(asked, applied))
        for number, running, applied in attempts
    ]
