"""Each attempt a UID of its own (as systemd's `DynamicUser=`, Nomad's dynamic workload
users), for an agent running as root without `--job-user` (docs/manage-nodes.md, "What a
job can reach"):

- **The range**: `oz0-node start --job-uids FIRST-LAST`, by default DEFAULT_RANGE
  (61184-65519, systemd's range for its dynamic users: on a machine whose services use
  `DynamicUser=`, give another). No account has one of them: no line in /etc/passwd, so
  `crontab`, `at` and `su` refuse such a UID; its group is the GID of the same number, no
  supplementary group.
- **Claims**: CLAIMS_DIR/<uid> (0600, in a 0700 directory of root's), one per UID in use,
  shared by every agent of the machine (the directory outlives each agent and each data
  directory). The attempt's supervisor makes the claim (O_EXCL, then locked with flock) and
  holds the lock for its whole life, so a UID is never given twice while an attempt has
  it; the claim is removed only once a sweep (uid_sweep.py) found nothing left of the UID,
  so a UID is never given while it still owns leftovers. A claim whose lock nobody holds is
  stale (its supervisor died, or its sweep left something): whoever finds it (the agent at
  its start, a supervisor that finds no free UID, the agent ending a dead supervisor's
  attempt) sweeps the UID and removes the claim if nothing is left.
- **The machine check** at the agent's start (`check_machine`): no account in the passwd
  or group database (`getpwall`, `getgrall`: /etc/passwd and /etc/group, and whatever else
  NSS lists) nor a dynamic user of systemd (/run/systemd/dynamic-uid) has a UID or GID of
  the range; no process has one (/proc/PID/status; a zombie is ended), no System V IPC object
  (/proc/sysvipc), and no file in the places the sweep covers (uid_sweep.SHARED_PLACES, at
  most uid_sweep.MAX_ENTRIES entries each, going where such a UID could have gone) nor
  directly in /home, /var/spool/cron/crontabs or /var/spool/cron/atjobs — each unless the
  UID is claimed (an attempt of this or another agent has it, or had it and is swept).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import grp
import json
import logging
import os
import pwd
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oz0_node.jobs import uid_sweep

log = logging.getLogger(__name__)

CLAIMS_DIR = Path("/var/lib/oz0-node-uids")
SYSTEMD_DYNAMIC = Path("/run/systemd/dynamic-uid")
# Looked at directly (not below): a home, a crontab or an at job of a UID of the range.
ACCOUNT_PLACES = (Path("/home"), Path("/var/spool/cron/crontabs"), Path("/var/spool/cron/atjobs"))
_RANGE = re.compile(r"([0-9]+)-([0-9]+)")
# The highest UID a range may reach: (uid_t)-1 and -2 mean "none" to the kernel and NFS.
MAX_UID = 4294967293
# Below: the system's and people's accounts.
MIN_UID = 1000
# Looks of the machine check before it gives up telling a stranger from attempts starting.
CHECK_LOOKS = 5


class NoFreeUid(OSError):
    pass


@dataclass(frozen=True)
class UidRange:
    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """FIRST-LAST; ValueError with one line saying what is wrong."""
        match = _RANGE.fullmatch(text.strip())
        if match is None:
            raise ValueError(f"--job-uids must be FIRST-LAST (such as 61184-65519), not {text!r}")
        first, last = int(match[1]), int(match[2])
        if not MIN_UID <= first <= last <= MAX_UID:
            raise ValueError(
                f"--job-uids {text}: FIRST must be at least {MIN_UID}, and LAST at least "
                f"FIRST and at most {MAX_UID}"
            )
        return cls(first, last)

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __len__(self) -> int:
        return self.last - self.first + 1

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"


DEFAULT_RANGE = UidRange(61184, 65519)


class Claim:
    """One UID held: its claim file, locked through FD while this process lives."""

    def __init__(self, uid: int, path: Path, fd: int) -> None:
        self.uid = uid
        self.path = path
        self.fd = fd

    def release(self) -> None:
        """Nothing of the UID is left: the claim goes (then the lock)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self.close()

    def close(self) -> None:
        """Let go of the lock and keep the claim (stale: swept again by whoever finds it)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def _same_file(fd: int, path: Path) -> bool:
    try:
        named = path.stat()
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


@dataclass(frozen=True)
class UidClaims:
    """The machine's claims (CLAIMS_DIR) on the UIDs of RANGE."""

    range: UidRange = DEFAULT_RANGE
    directory: Path = CLAIMS_DIR

    def path(self, uid: int) -> Path:
        return self.directory / str(uid)

    def ensure_directory(self) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(self.directory)
        if info.st_uid != os.geteuid() or info.st_mode & 0o077:
            raise OSError(
                errno.EPERM, "must be a directory of the agent's user, closed to others",
                str(self.directory),
            )  # fmt: skip

    def take(self, holder: str, sweep: Callable[[int], uid_sweep.Swept] = uid_sweep.sweep) -> Claim:
        """A UID of the range no one holds nor has left anything of, claimed and locked for
        HOLDER (what the claim says it is for: the attempt's directory). NoFreeUid when
        every UID is claimed, even after stale claims were swept (SWEEP)."""
        for tries in range(2):
            span = len(self.range)
            start = random.randrange(span)  # supervisors starting at once seldom meet
            for step in range(span):
                uid = self.range.first + (start + step) % span
                claim = self._try(uid, holder)
                if claim is not None:
                    return claim
            if tries == 0 and not self.reclaim_stale(sweep):
                break
        raise NoFreeUid(errno.EAGAIN, f"every UID of {self.range} is in use", str(self.directory))

    def _try(self, uid: int, holder: str) -> Claim | None:
        path = self.path(uid)
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        try:
            fd = os.open(path, flags, 0o600)
        except FileExistsError:
            return None
        except FileNotFoundError:
            # The directory went (removed by hand): made again as the agent's start makes it.
            self.ensure_directory()
            fd = os.open(path, flags, 0o600)
        try:
            # Another's reclaim may have taken it between the two: then it is theirs.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if not _same_file(fd, path):
                raise BlockingIOError
            os.write(fd, json.dumps({"holder": holder, "pid": os.getpid()}).encode())
        except OSError:
            os.close(fd)
            return None
        return Claim(uid, path, fd)

    def claimed(self) -> set[int]:
        """The UIDs of the range with a claim (held or stale)."""
        try:
            names = os.listdir(self.directory)  # noqa: PTH208 (names only)
        except FileNotFoundError:
            return set()
        return {int(n) for n in names if n.isdigit() and int(n) in self.range}

    def reclaim(self, uid: int, sweep: Callable[[int], uid_sweep.Swept]) -> uid_sweep.Swept | None:
        """If UID's claim is stale (no process holds its lock): sweep the UID (SWEEP) and
        remove the claim if nothing is left. What the sweep did, or None (not stale, no
        claim)."""
        path = self.path(uid)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            return None
        claim = Claim(uid, path, fd)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            claim.close()  # held: its attempt runs, or is being swept
            return None
        if not _same_file(fd, path):
            claim.close()
            return None
        swept = sweep(uid)
        if swept.clean:
            claim.release()
        else:
            claim.close()
        return swept

    def reclaim_stale(self, sweep: Callable[[int], uid_sweep.Swept] = uid_sweep.sweep) -> int:
        """Sweep every stale claim's UID (see `reclaim`); how many claims were removed."""
        removed = 0
        for uid in sorted(self.claimed()):
            swept = self.reclaim(uid, sweep)
            if swept is None:
                continue
            log.info("UID %d had a stale claim (its supervisor died): %s", uid, swept.describe())
            removed += swept.clean
        return removed


def check_machine(claims: UidClaims) -> str | None:
    """Why CLAIMS' range cannot be used on this machine (see the module's docstring: what
    has a UID of the range and no claim), on one line; None when nothing has."""
    uids = claims.range
    # A UID claimed at any moment of the check is an attempt's (of this agent or another,
    # starting meanwhile): the claims are read before and after each look, and what a look
    # finds counts only if its UID had no claim on either side of it and it is found again
    # by the next look (an attempt that came and went meanwhile swept its things before
    # giving its claim up).
    claimed = claims.claimed()  # grows: never rebound, so WANTED sees each claim read

    def wanted(uid: int) -> bool:
        return uid in uids and uid not in claimed

    last: Foreign | None = None
    for _ in range(CHECK_LOOKS):
        found = _foreign_use(uids, wanted)
        claimed |= claims.claimed()
        if found is None:
            return None
        if found.uid in claimed:
            last = None
            continue
        if found == last:
            break
        last = found
    else:
        if last is None:
            # Each look found a UID claimed meanwhile: attempts start faster than it looks.
            return None
    assert last is not None
    return (
        f"the job UIDs {uids} are not free on this machine: {last.what}; give another range "
        f"with --job-uids FIRST-LAST, or --job-user NAME"
    )


@dataclass(frozen=True)
class Foreign:
    """A thing with a UID (or GID) of the range: UID, said in a few words (WHAT)."""

    uid: int
    what: str


def _foreign_use(uids: UidRange, wanted: Callable[[int], bool]) -> Foreign | None:
    """The first thing found with a UID WANTED says is not ours, said in a few words."""
    for user in pwd.getpwall():
        if wanted(user.pw_uid) or wanted(user.pw_gid):
            uid = user.pw_uid if wanted(user.pw_uid) else user.pw_gid
            return Foreign(
                uid, f"the account {user.pw_name} has uid {user.pw_uid}, gid {user.pw_gid}"
            )
    for group in grp.getgrall():
        if wanted(group.gr_gid):
            return Foreign(group.gr_gid, f"the group {group.gr_name} has gid {group.gr_gid}")
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(SYSTEMD_DYNAMIC)):  # noqa: PTH208
            if name.isdigit() and wanted(int(name)):
                return Foreign(
                    int(name), f"systemd gave uid {name} to a service ({SYSTEMD_DYNAMIC})"
                )
    for process in uid_sweep.processes(wanted):
        if process.zombie:
            continue  # ended; its parent has yet to wait for it
        uid = next((u for u in process.uids if wanted(u)), process.uids[0])
        return Foreign(uid, f"process {process.pid} runs as uid {'/'.join(map(str, process.uids))}")
    for obj in uid_sweep.ipc_objects(wanted):
        return Foreign(obj.uid, f"System V {obj.kind} {obj.id} belongs to uid {obj.uid}")
    for place in uid_sweep.SHARED_PLACES:
        owned = uid_sweep.first_owned(place, wanted)
        if owned is not None:
            return Foreign(owned[1], f"{owned[0]} belongs to uid {owned[1]}")
    for place in ACCOUNT_PLACES:
        with contextlib.suppress(OSError), os.scandir(place) as entries:
            for entry in entries:
                with contextlib.suppress(OSError):
                    owner = entry.stat(follow_symlinks=False).st_uid
                    if wanted(owner):
                        return Foreign(owner, f"{entry.path} belongs to uid {owner}")
    return None
