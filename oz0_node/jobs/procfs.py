"""What Linux's /proc says, parsed: cgroup mounts (/proc/self/mountinfo), a process's
cgroups (/proc/PID/cgroup) and a process's state, parent and start time (/proc/PID/stat).

Pure functions on text, so they are tested on text; the readers around them return None
(or nothing) where /proc is missing or the process is gone.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
_OCTAL = re.compile(r"\\([0-7]{3})")


@dataclass(frozen=True)
class Mount:
    """One line of mountinfo: which part (ROOT) of which file system is mounted where."""

    root: str
    mount_point: Path
    fstype: str
    super_options: tuple[str, ...]


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \040, \011, \012, \134.
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[Mount]:
    """The mounts TEXT (a /proc/PID/mountinfo) lists; malformed lines are skipped.

    A line: ID PARENT MAJ:MIN ROOT MOUNT_POINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER."""
    mounts = []
    for line in text.splitlines():
        before, sep, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if not sep or len(fields) < 6 or len(tail) < 3:
            continue
        mounts.append(
            Mount(
                root=_unescape(fields[3]),
                mount_point=Path(_unescape(fields[4])),
                fstype=tail[0],
                super_options=tuple(tail[2].split(",")),
            )
        )
    return mounts


def parse_proc_cgroup(text: str) -> dict[str, str]:
    """Controller name → cgroup path, from TEXT (a /proc/PID/cgroup). The cgroup v2
    hierarchy ("0::/path") is under the name "" ; v1 lines give one entry per controller
    ("4:memory:/x"; "1:name=systemd:/" is under "name=systemd")."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3 or not parts[2].startswith("/"):
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            found[""] = path
            continue
        for controller in controllers.split(","):
            if controller:
                found[controller] = path
    return found


def cgroup_dir(mounts: list[Mount], own: dict[str, str], controller: str) -> Path | None:
    """Where this process's cgroup of CONTROLLER ("" for the v2 hierarchy) is in the file
    system; None when that hierarchy is not mounted, or mounted from a part above which
    this process's cgroup does not lie (a container's view)."""
    path = own.get(controller)
    if path is None:
        return None
    for mount in mounts:
        if controller == "":
            if mount.fstype != "cgroup2":
                continue
        elif mount.fstype != "cgroup" or controller not in mount.super_options:
            continue
        root = mount.root.rstrip("/")
        if path != root and not path.startswith(root + "/"):
            continue
        rest = path[len(root) :].strip("/")
        return mount.mount_point / rest if rest else mount.mount_point
    return None


@dataclass(frozen=True)
class ProcStat:
    pid: int
    state: str
    ppid: int
    pgrp: int
    # Clock ticks after boot: with the PID, what tells this process from a later one that
    # reused its number.
    start_time: int

    @property
    def zombie(self) -> bool:
        return self.state in ("Z", "X")


def parse_stat(pid: int, text: bytes) -> ProcStat | None:
    """TEXT, a /proc/PID/stat: `pid (comm) state ppid pgrp ... starttime(22) ...`; comm may
    hold spaces and parentheses, so fields are counted from the last ')'."""
    close = text.rfind(b")")
    if close < 0:
        return None
    fields = text[close + 2 :].split()
    if len(fields) < 20:
        return None
    try:
        return ProcStat(
            pid=pid,
            state=fields[0].decode("ascii", "replace"),
            ppid=int(fields[1]),
            pgrp=int(fields[2]),
            start_time=int(fields[19]),
        )
    except ValueError:
        return None


def read_stat(pid: int) -> ProcStat | None:
    """PID's stat, or None when there is no such process (or no /proc)."""
    try:
        text = (PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    return parse_stat(pid, text)


def all_stats() -> Iterator[ProcStat]:
    """Every process /proc shows (those that end while it is read are left out)."""
    try:
        entries = os.listdir(PROC)  # noqa: PTH208 (names only, no Path per entry)
    except OSError:
        return
    for name in entries:
        if name.isdigit():
            stat = read_stat(int(name))
            if stat is not None:
                yield stat


def same_process(pid: int, start_time: int) -> ProcStat | None:
    """PID's stat if it is still the process that had START_TIME, else None: a PID reused
    by another process is never taken for the one recorded (Nomad #23969)."""
    stat = read_stat(pid)
    if stat is None or stat.start_time != start_time:
        return None
    return stat


def descendants(roots: set[int], stats: list[ProcStat]) -> set[int]:
    """ROOTS and every process in STATS whose chain of parents reaches one of them."""
    children: dict[int, list[int]] = {}
    for stat in stats:
        children.setdefault(stat.ppid, []).append(stat.pid)
    found, todo = set(roots), list(roots)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def environ_has(pid: int, wanted: Mapping[str, str]) -> bool:
    """Whether PID's initial environment holds every NAME=VALUE of WANTED."""
    try:
        raw = (PROC / str(pid) / "environ").read_bytes()
    except OSError:
        return False
    entries = set(raw.split(b"\0"))
    return all(f"{k}={v}".encode() in entries for k, v in wanted.items())


def one_thread() -> bool:
    """Whether this process has a single thread (of any kind: /proc counts them all), so
    that a fork of it may run Python code before its exec: no other thread held a lock."""
    try:
        with (PROC / "self" / "status").open("rb") as f:
            for line in f:
                if line.startswith(b"Threads:"):
                    return int(line.split()[1]) == 1
    except (OSError, ValueError):
        pass
    return False
