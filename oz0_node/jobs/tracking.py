"""How an attempt's processes are followed and ended: its own cgroup v2 (whatever its
processes start stays in it; `cgroup.kill` ends them all), else the agent as their child
subreaper following them in /proc by PID and start time, else (neither) its process group.
Also the cgroup directories themselves: made fresh, ended, removed (isolation.py decides
which is used; docs/manage-nodes.md, "What a job can reach").
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from oz0_node.jobs import procfs
from oz0_node.jobs.procfs import ProcStat

log = logging.getLogger(__name__)

CGROUP_V2 = "cgroup v2"
SUBREAPER = "subreaper"
PROCESS_GROUP = "process group"
# Subreaper tracking: how often the attempt's processes are looked for. A process that
# forks and exits between two looks leaves its child unseen (then found by its OZ0_ names).
SCAN_EVERY = 0.2
# How long removing a cgroup waits for the kernel to let its last processes go.
RMDIR_WAIT = 2.0
PR_SET_CHILD_SUBREAPER = 36
PR_GET_CHILD_SUBREAPER = 37


class Tracking(Protocol):
    kind: str

    def started(self, pid: int) -> None:
        """The command's process is PID."""

    def alive(self) -> list[int]:
        """The attempt's processes that still run (zombies do not count)."""

    def signal_all(self, sig: signal.Signals) -> None: ...

    def kill_all(self) -> None:
        """SIGKILL to every one of them."""

    def refresh(self) -> bool:
        """Look for new processes (and reap adopted ones); whether the record changed."""

    def recorded(self) -> list[list[int]]:
        """[PID, start time] of each process followed, for DIR/attempts.json."""


def _not_zombies(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        found = procfs.read_stat(pid)
        if found is not None and not found.zombie:
            alive.append(pid)
    return alive


def cgroup_members(path: Path) -> list[int]:
    try:
        text = (path / "cgroup.procs").read_text()
    except OSError:
        return []
    return [int(word) for word in text.split() if word.isdigit()]


def signal_quietly(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@dataclass
class CgroupTracking:
    """The attempt's own cgroup v2: whatever its processes start stays in it."""

    path: Path
    kind: str = CGROUP_V2

    def started(self, pid: int) -> None:
        pass

    def alive(self) -> list[int]:
        return _not_zombies(cgroup_members(self.path))

    def signal_all(self, sig: signal.Signals) -> None:
        for pid in cgroup_members(self.path):
            signal_quietly(pid, sig)

    def kill_all(self) -> None:
        try:
            (self.path / "cgroup.kill").write_text("1")
        except OSError:  # before Linux 5.14: one by one (the loop that waits repeats it)
            self.signal_all(signal.SIGKILL)

    def refresh(self) -> bool:
        return False

    def recorded(self) -> list[list[int]]:
        return []


@dataclass
class SubreaperTracking:
    """The command's descendants, followed in /proc by PID and start time. The agent is a
    child subreaper, so an orphan comes to it rather than to init: its parent chain still
    leads here, and the agent reaps it (asyncio waits only for the command)."""

    marker: Mapping[str, str]
    tracked: dict[int, int] = field(default_factory=dict)
    command: int | None = None
    kind: str = SUBREAPER

    def started(self, pid: int) -> None:
        self.command = pid
        found = procfs.read_stat(pid)
        if found is not None:
            self.tracked[pid] = found.start_time

    def refresh(self) -> bool:
        stats = list(procfs.all_stats())
        by_pid = {s.pid: s for s in stats}
        before = dict(self.tracked)
        live = {p: t for p, t in self.tracked.items() if _same(by_pid.get(p), t)}
        me = os.getpid()
        roots = set(live)
        for s in stats:
            # An orphan whose parent died before it was seen: it came to the agent, and
            # its OZ0_ names say whose it is.
            if (
                s.ppid == me
                and s.pid not in live
                and s.pid != self.command
                and not s.zombie
                and procfs.environ_has(s.pid, self.marker)
            ):
                roots.add(s.pid)
        for pid in procfs.descendants(roots, stats):
            found = by_pid.get(pid)
            if found is None:
                continue
            if found.zombie and found.ppid == me and pid != self.command:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                continue
            live.setdefault(pid, found.start_time)
        self.tracked = live
        return live != before

    def alive(self) -> list[int]:
        self.refresh()
        return _not_zombies(list(self.tracked))

    def signal_all(self, sig: signal.Signals) -> None:
        self.refresh()
        for pid, start in list(self.tracked.items()):
            if procfs.same_process(pid, start) is not None:
                signal_quietly(pid, sig)

    def kill_all(self) -> None:
        self.signal_all(signal.SIGKILL)

    def recorded(self) -> list[list[int]]:
        return [[pid, start] for pid, start in sorted(self.tracked.items())]


def _same(found: ProcStat | None, start_time: int) -> bool:
    return found is not None and found.start_time == start_time


@dataclass
class GroupTracking:
    """Neither cgroup v2 nor a subreaper: the command's process group, as before (what
    leaves it with setsid escapes)."""

    pgid: int = 0
    kind: str = PROCESS_GROUP

    def started(self, pid: int) -> None:
        self.pgid = pid  # its own session: the group's ID is its PID

    def alive(self) -> list[int]:
        from oz0_node.jobs.process import members

        return members(self.pgid) if self.pgid else []

    def signal_all(self, sig: signal.Signals) -> None:
        if self.pgid:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pgid, sig)

    def kill_all(self) -> None:
        self.signal_all(signal.SIGKILL)

    def refresh(self) -> bool:
        return False

    def recorded(self) -> list[list[int]]:
        return []


def remove_cgroup(path: Path) -> None:
    """rmdir PATH once the kernel has let its processes go (bounded); a failure is logged."""
    deadline = time.monotonic() + RMDIR_WAIT
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError as e:
            if time.monotonic() >= deadline:
                log.warning("cannot remove cgroup %s: %s", path, e.strerror or e)
                return
            time.sleep(0.02)


def end_cgroup(path: Path) -> int:
    """SIGKILL every process in cgroup PATH (cgroup.kill where there is one), wait until it
    is empty (bounded), remove it; how many processes it held."""
    members = cgroup_members(path)
    if members:
        try:
            (path / "cgroup.kill").write_text("1")
        except OSError:
            for pid in members:
                signal_quietly(pid, signal.SIGKILL)
    deadline = time.monotonic() + RMDIR_WAIT
    while cgroup_members(path) and time.monotonic() < deadline:
        for pid in cgroup_members(path):
            signal_quietly(pid, signal.SIGKILL)
        time.sleep(0.02)
    remove_cgroup(path)
    return len(members)


# How many times an attempt's cgroup is made again when its parent went meanwhile.
PARENT_TRIES = 5


def fresh_cgroup(parent: Path, name: str, *, v2: bool) -> Path:
    """An empty cgroup PARENT/NAME (PARENT made if needed; a leftover of that name is
    ended first). In v2, PARENT passes the memory, cpu and pids controllers it has on."""
    cgroup = parent / name
    for tries_left in reversed(range(PARENT_TRIES)):
        if not parent.is_dir():
            parent.mkdir(exist_ok=True)
            if v2:
                enable_controllers(parent)
        if cgroup.is_dir():
            end_cgroup(cgroup)
        try:
            cgroup.mkdir()
            return cgroup
        except FileNotFoundError:
            # PARENT went meanwhile: the last attempt in it ended and removed it (each
            # attempt's supervisor removes the emptied subtree, isolation.end). Again.
            if tries_left == 0:
                raise
    raise AssertionError("unreachable")


def enable_controllers(subtree: Path) -> None:
    """Turn on, for the attempts' cgroups, the controllers SUBTREE has (those its parent
    enabled for it). SUBTREE holds no process, so v2 allows it."""
    try:
        available = set((subtree / "cgroup.controllers").read_text().split())
    except OSError:
        return
    for controller in ("memory", "cpu", "pids"):
        if controller in available:
            try:
                (subtree / "cgroup.subtree_control").write_text(f"+{controller}")
            except OSError as e:
                log.info("cannot enable %s for attempts in %s: %s", controller, subtree, e)


def is_subreaper() -> bool:
    """Whether this process is a child subreaper now: the kernel's word, the one place
    that holds it (become_subreaper and stop_being_subreaper change it there)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        flag = ctypes.c_int(0)
        if libc.prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False
    return flag.value != 0


def become_subreaper() -> bool:
    """Make this process a child subreaper (Linux 3.4+): orphans of its descendants come to
    it rather than to init. Whether it is one."""
    if is_subreaper():
        return True
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            log.warning("cannot become a child subreaper: %s", os.strerror(ctypes.get_errno()))
            return False
    except (OSError, AttributeError):
        return False
    return True


def stop_being_subreaper() -> None:
    """Undo become_subreaper: for a process (a test runner) that forced the subreaper
    tracking for a while and must not adopt its other tests' orphans from then on."""
    if is_subreaper():
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)
