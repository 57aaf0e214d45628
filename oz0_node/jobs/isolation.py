"""Where and as whom an attempt runs, what it may use, and how all of its processes end
(docs/manage-nodes.md, "What a job can reach").

- **As whom**: when the agent runs as root, each attempt runs as a UID of its own
  (attempt_uids.py: taken from `--job-uids`, default 61184-65519, for the attempt's life and
  its cleanup; no account, so `crontab`, `at` and `su` refuse it; its group the GID of the
  same number, no other). `--job-user NAME` runs every attempt as that account instead (its
  uid, gid and own supplementary groups; weaker: its jobs share it), `--job-user root` as
  root. An agent that is not root runs jobs as itself (nothing else is possible).
- **Where**: a fresh directory in the system's temporary directory (0700, the attempt's
  user's), its HOME and TMPDIR, removed when the attempt ends; never in the data directory,
  which no job user can read. An attempt with a UID of its own also gets /tmp and /var/tmp
  of its own where the kernel allows (private_tmp.py: a mount namespace).
- **With what**: a clean environment (a standard PATH, HOME, USER, LOGNAME, LANG when the
  agent has one, TMPDIR), then the job's names, then OZ0_JOB_ID, OZ0_ATTEMPT, OZ0_NODE_ID.
- **Tracked how**: a cgroup v2 per attempt under `<agent's cgroup>/oz0-node-<node ID>/`
  where the agent can write its own v2 cgroup (its end: SIGTERM to every member, SIGKILL
  through `cgroup.kill` after the grace, then the cgroup is removed); else the agent is a
  child subreaper and follows the attempt's descendants in /proc (PID and start time).
- **Limited how**: memory, cpu and processes through a cgroup controller (v2 where the
  agent's subtree has it, else the machine's v1 hierarchy), open files and address space
  through rlimits; the result says what was applied and how.
- **Swept after**: once an attempt with a UID of its own has ended, every process of that
  UID is killed (its cgroup v2 held them all; else a scan of /proc by UID) and its System V
  IPC objects and its files in /dev/shm, /dev/mqueue,
  /run/lock, and /tmp and /var/tmp unless it had its own, removed (uid_sweep.py); only then
  is the UID given again. The result's `applied` says what held (`private_tmp`) and what
  the sweep found (`swept`).
- **Left by a crash**: DIR/attempts.json (0600, replaced atomically) records each running
  attempt's directory, cgroups, (subreaper) processes with their start times and own UID;
  the next start of the agent ends what is left of them (`end_leftovers`), removes the
  directories and sweeps the UIDs.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import resource
import signal
import tempfile
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oz0_common.files import write_private
from oz0_node import layout
from oz0_node.errors import AgentError
from oz0_node.jobs import procfs, uid_sweep
from oz0_node.jobs.attempt_uids import DEFAULT_RANGE, Claim, UidClaims, UidRange, check_machine
from oz0_node.jobs.job_user import JobUser, own_user, resolve_job_user
from oz0_node.jobs.private_tmp import HELD, PrivateTmp
from oz0_node.jobs.removal import remove_tree
from oz0_node.jobs.spawn import ChildSteps
from oz0_node.jobs.tracking import (
    CGROUP_V2,
    PROCESS_GROUP,
    SUBREAPER,
    CgroupTracking,
    GroupTracking,
    SubreaperTracking,
    Tracking,
    become_subreaper,
    end_cgroup,
    fresh_cgroup,
    remove_cgroup,
    signal_quietly,
)

log = logging.getLogger(__name__)

# Not the agent's PATH: a job finds the system's programs, nothing the agent's user added.
STANDARD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RECORD_FILE = "attempts.json"
# DATA_DIR/attempts/<job>-<n>/: one attempt's supervisor's directory (attempt_files.py).
ATTEMPTS_DIR = "attempts"
WORKDIR_PREFIX = "oz0-job-"
SUBTREE_PREFIX = "oz0-node-"
# OZ0_NODE_TRACKING=subreaper: track by /proc even where cgroup v2 could be used (tests,
# and machines whose v2 hierarchy another manager owns).
TRACKING_ENV = "OZ0_NODE_TRACKING"
CPU_PERIOD_US = 100_000
V1_CONTROLLERS = ("memory", "pids", "cpu")
LIMIT_KEYS = ("memory", "cpu", "max_processes", "max_open_files", "address_space")


# --- limits -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limits:
    memory: int | None = None
    cpu: float | None = None
    max_processes: int | None = None
    max_open_files: int | None = None
    address_space: int | None = None
    # Names this node does not know (a newer server's): reported as not applied.
    unknown: tuple[str, ...] = ()

    def asked(self) -> list[str]:
        return [k for k in LIMIT_KEYS if getattr(self, k) is not None]


def parse_limits(raw: object) -> Limits | str:
    """The attempt's `limits` object as Limits, or why it is malformed."""
    if raw is None:
        return Limits()
    if not isinstance(raw, dict):
        return "limits must be a JSON object or null"
    values: dict[str, int | float | None] = {}
    for key in LIMIT_KEYS:
        value = raw.get(key)
        if value is None:
            continue
        if key == "cpu":
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                return f"limits.cpu must be a positive fraction of one CPU, not {value!r}"
            values[key] = float(value)
        else:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                return f"limits.{key} must be a whole number from 1, not {value!r}"
            values[key] = value
    unknown = tuple(sorted(str(k) for k in raw if k not in LIMIT_KEYS))
    return Limits(unknown=unknown, **values)  # type: ignore[arg-type]


# --- what a crash left: DIR/attempts.json -------------------------------------------------


class AttemptRecord:
    """The running attempts' directories, cgroups and processes, on disk for the next start."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()  # attempts of two runtimes may overlap at a stop
        self._entries: dict[str, dict[str, object]] = {}

    def put(self, key: str, entry: dict[str, object]) -> None:
        with self._lock:
            self._entries[key] = entry
            self._write()

    def drop(self, key: str) -> None:
        with self._lock:
            if self._entries.pop(key, None) is not None:
                self._write()

    def _write(self) -> None:
        data = {"agent_pid": os.getpid(), "attempts": self._entries}
        try:
            # Not synced: it names live processes and cgroups, which a crash of the machine
            # takes with it; a process's crash leaves the page cache (3 fsyncs were half of
            # a supervisor's launch).
            write_private(self.path, (json.dumps(data, indent=1) + "\n").encode(), sync=False)
        except OSError as e:
            log.warning("cannot write %s: %s", self.path, e.strerror or e)

    def load(self) -> dict[str, dict[str, object]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s; no leftovers ended", self.path, e)
            return {}
        attempts = raw.get("attempts") if isinstance(raw, dict) else None
        if not isinstance(attempts, dict):
            return {}
        return {str(k): v for k, v in attempts.items() if isinstance(v, dict)}


# --- one attempt's place ------------------------------------------------------------------


@dataclass
class Placement:
    """What one attempt runs in: made by Isolation.begin, undone by Isolation.end."""

    key: str
    workdir: Path
    env: dict[str, str]
    steps: ChildSteps  # what the command's process does before its exec (spawn.py)
    tracking: Tracking
    cgroups: list[Path]
    applied: dict[str, object]
    claim: Claim | None = None  # its own UID, held until the sweep finds nothing left
    uid_claims: Path | None = None  # where that claim is
    private: PrivateTmp | None = None  # its own /tmp, if it has its own UID
    named: JobUser | None = None  # the account a session asked for (`begin`'s AS_USER)

    def entry(self, pids: list[list[int]]) -> dict[str, object]:
        """What the record (attempts.json, tracking.json) says of it: what to end and
        sweep if its supervisor dies."""
        entry: dict[str, object] = {
            "workdir": str(self.workdir),
            "cgroups": [str(p) for p in self.cgroups],
            "pids": pids,
        }
        if self.claim is not None:
            entry["uid"] = self.claim.uid
            entry["uid_claims"] = str(self.uid_claims)
        return entry


def _write(path: Path, text: str) -> None:
    path.write_text(text)


@dataclass
class Isolation:
    """How this agent runs attempts (one per agent process; see the module's docstring)."""

    data_dir: Path
    user: JobUser | None  # the account jobs run as; None: each attempt its own UID (UIDS)
    drop: bool  # change to the job user in the child (an agent running as root)
    tracking: str
    v2_own: Path | None = None  # the agent's own cgroup v2 (the subtree goes under it)
    v1_own: dict[str, Path] = field(default_factory=dict)
    temp_dir: Path = field(default_factory=lambda: Path(tempfile.gettempdir()))
    uids: UidClaims | None = None  # where each attempt's own UID comes from (USER None)
    record: AttemptRecord = field(init=False)

    def __post_init__(self) -> None:
        self.record = AttemptRecord(self.data_dir / RECORD_FILE)

    @classmethod
    def detect(
        cls,
        data_dir: Path,
        job_user: str | None = None,
        *,
        tracking: str | None = None,
        supervised: bool = False,
        job_uids: UidRange | None = None,
    ) -> Isolation:
        """What this machine and this agent allow: the job user (or each attempt's own UID,
        from JOB_UIDS), cgroups, subreaper. AgentError when the job user cannot be.

        SUPERVISED: attempts run under supervisors (supervisor.py), each its command's
        subreaper; this process does not become one (it would adopt them all)."""
        user = resolve_job_user(job_user)
        if job_uids is not None and user is not None:
            raise AgentError(
                "--job-uids is for attempts that each run as a UID of their own, which only an "
                "agent running as root without --job-user gives"
            )
        uids = UidClaims(job_uids or DEFAULT_RANGE) if user is None else None
        drop = os.geteuid() == 0 and (user is None or user.uid != 0)
        mounts: list[procfs.Mount] = []
        own: dict[str, str] = {}
        with contextlib.suppress(OSError):
            mounts = procfs.parse_mountinfo((procfs.PROC / "self" / "mountinfo").read_text())
            own = procfs.parse_proc_cgroup((procfs.PROC / "self" / "cgroup").read_text())
        v2 = procfs.cgroup_dir(mounts, own, "")
        v1 = {}
        for controller in V1_CONTROLLERS:
            found = procfs.cgroup_dir(mounts, own, controller)
            if found is not None and os.access(found, os.W_OK):
                v1[controller] = found
        wanted = tracking or os.environ.get(TRACKING_ENV) or None
        usable_v2 = (
            v2 is not None
            and os.access(v2, os.W_OK)
            and os.access(v2 / "cgroup.procs", os.W_OK)
            and wanted != SUBREAPER
        )
        if usable_v2:
            kind = CGROUP_V2
        else:
            kind = SUBREAPER if supervised or become_subreaper() else PROCESS_GROUP
            v2 = None
        return cls(data_dir, user, drop, kind, v2_own=v2, v1_own=v1, uids=uids)

    def handed(self) -> dict[str, object]:
        """This isolation as the agent hands it to an attempt's supervisor (`from_handed`)."""
        user = self.user
        return {
            "data_dir": str(self.data_dir),
            "user": None
            if user is None
            else {"name": user.name, "uid": user.uid, "gid": user.gid, "groups": list(user.groups)},
            "drop": self.drop,
            "tracking": self.tracking,
            "v2_own": str(self.v2_own) if self.v2_own is not None else None,
            "v1_own": {k: str(v) for k, v in self.v1_own.items()},
            "temp_dir": str(self.temp_dir),
            "uids": None
            if self.uids is None
            else {
                "first": self.uids.range.first,
                "last": self.uids.range.last,
                "claims": str(self.uids.directory),
            },
        }

    @classmethod
    def from_handed(cls, raw: Mapping[str, Any]) -> Isolation:
        """What `handed` wrote (trusted: the agent's own, of the same code)."""
        user, uids, v2_own = raw["user"], raw["uids"], raw["v2_own"]
        return cls(
            data_dir=Path(raw["data_dir"]),
            user=None
            if user is None
            else JobUser(user["name"], int(user["uid"]), int(user["gid"]), tuple(user["groups"])),
            drop=bool(raw["drop"]),
            tracking=str(raw["tracking"]),
            v2_own=Path(v2_own) if v2_own is not None else None,
            v1_own={k: Path(v) for k, v in raw["v1_own"].items()},
            temp_dir=Path(raw["temp_dir"]),
            uids=None
            if uids is None
            else UidClaims(UidRange(int(uids["first"]), int(uids["last"])), Path(uids["claims"])),
        )

    def subtree(self, node_id: str) -> Path | None:
        return self.v2_own / f"{SUBTREE_PREFIX}{node_id}" if self.v2_own is not None else None

    def describe(self, node_id: str | None) -> dict[str, str]:
        tracking = self.tracking
        if self.tracking == CGROUP_V2 and node_id is not None:
            tracking = f"{CGROUP_V2} {self.subtree(node_id)}"
        job_user = self.user.name if self.user is not None else f"own uids {self.uids_range}"
        return {"job_user": job_user, "tracking": tracking}

    @property
    def uids_range(self) -> UidRange | None:
        return self.uids.range if self.uids is not None else None

    def _removes_as(self, user: JobUser) -> JobUser | None:
        """Who removes an attempt's directory first: its USER (the account's, or its own
        UID), when it is not root."""
        return user if self.drop else None

    @property
    def tools_on_path(self) -> bool:
        # DIR/tools/ is for plugins; a job user who is not the agent's cannot read it.
        return not self.drop and self.user is not None and self.user.uid == os.geteuid()

    def prepare_uids(self) -> None:
        """At the agent's start, for attempts with UIDs of their own: the claims' directory,
        the check that nothing on the machine uses the range (AgentError, one line), then
        the stale claims swept (attempt_uids.py)."""
        if self.uids is None:
            return
        try:
            self.uids.ensure_directory()
        except OSError as e:
            raise AgentError(
                f"cannot keep the job UIDs' claims in {self.uids.directory}: {e.strerror or e}"
            ) from None
        refused = check_machine(self.uids)
        if refused is not None:
            raise AgentError(refused)
        self.uids.reclaim_stale()

    def environment(
        self,
        workdir: Path,
        job_env: Mapping[str, str],
        oz0: Mapping[str, str],
        user: JobUser | None = None,
    ) -> dict[str, str]:
        """The command's environment (see the module's docstring), for USER (by default the
        account jobs run as)."""
        user = user or self.user
        assert user is not None  # an attempt's own UID is given by begin
        env = {
            "PATH": STANDARD_PATH,
            "HOME": str(workdir),
            "USER": user.name,
            "LOGNAME": user.name,
            "TMPDIR": str(workdir),
        }
        if "LANG" in os.environ:
            env["LANG"] = os.environ["LANG"]
        merged = {**env, **job_env, **oz0}
        # First even on a PATH the job sets, as for plugins.
        return layout.with_tools_on_path(merged, self.data_dir) if self.tools_on_path else merged

    # --- an attempt's place ---------------------------------------------------------------

    def begin(
        self,
        node_id: str,
        job_id: str,
        attempt: int,
        job_env: Mapping[str, str],
        limits: Limits,
        files: Sequence[tuple[str, str]] = (),
        as_user: JobUser | None = None,
    ) -> Placement:
        """Make the attempt's directory (with FILES in it: name, path of a checked copy)
        and cgroups, and the child's steps; OSError when they cannot be made (what was made
        is undone). AS_USER: a session's named account (the node allows it: an agent
        running as root, --session-users), instead of a UID of its own or the job user."""
        key = f"{job_id}-{attempt}"
        # Its own UID first (NoFreeUid, an OSError, when every one is in use).
        claim = (
            self.uids.take(str(self.record.path))
            if self.uids is not None and as_user is None
            else None
        )
        if claim is not None:
            user = own_user(claim.uid)
        elif as_user is not None:
            user = as_user
        else:
            assert self.user is not None  # no UIDS: the account jobs run as
            user = self.user
        try:
            workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{key}-", dir=self.temp_dir))
        except BaseException:
            if claim is not None:
                claim.release()  # nothing has had the UID yet
            raise
        made: list[Path] = []
        place = Placement(
            key, workdir, {}, ChildSteps(), GroupTracking(), made, {}, claim,
            self.uids.directory if self.uids is not None else None, named=as_user,
        )  # fmt: skip
        # A session's named account is taken on even where jobs run as the agent's user
        # (--job-user root): the node allowed that account, not root.
        drop = self.drop or (as_user is not None and os.geteuid() == 0)
        try:
            workdir.chmod(0o700)
            if drop:
                os.chown(workdir, user.uid, user.gid)
            for name, staged in files:
                _place_file(Path(staged), workdir / name, user if drop else None)
            self.record.put(key, place.entry([]))
            procs: list[Path] = []
            tracking: Tracking
            if self.tracking == CGROUP_V2:
                subtree = self.subtree(node_id)
                assert subtree is not None
                cgroup = fresh_cgroup(subtree, key, v2=True)
                made.append(cgroup)
                procs.append(cgroup / "cgroup.procs")
                tracking = CgroupTracking(cgroup)
            elif self.tracking == SUBREAPER:
                tracking = SubreaperTracking(
                    {"OZ0_NODE_ID": node_id, "OZ0_JOB_ID": job_id, "OZ0_ATTEMPT": str(attempt)}
                )
            else:
                tracking = GroupTracking()
            applied_limits, rlimits = self._limits(node_id, key, limits, made, procs, user)
            if claim is not None:
                place.private = PrivateTmp(workdir)
            self.record.put(key, place.entry([]))
        except BaseException:
            for cgroup in reversed(made):
                remove_cgroup(cgroup)
            remove_tree(workdir, as_user=self._removes_as(user))
            self._sweep(place)
            self.record.drop(key)
            raise
        oz0 = {"OZ0_JOB_ID": job_id, "OZ0_ATTEMPT": str(attempt), "OZ0_NODE_ID": node_id}
        v2 = made[0] if self.tracking == CGROUP_V2 else None
        place.steps = ChildSteps(
            cgroup=v2,
            join=tuple(os.fsencode(p) for p in procs if v2 is None or p.parent != v2),
            private=place.private,
            rlimits=tuple(rlimits),
            user=user if drop else None,
        )
        place.tracking = tracking
        place.applied = {
            "user": f"uid {claim.uid} (its own)" if claim is not None else user.name,
            "tracking": tracking.kind,
            "limits": applied_limits,
        }
        place.env = self.environment(workdir, job_env, oz0, user)
        return place

    def note(self, placement: Placement) -> None:
        """Record PLACEMENT's processes as they are now (subreaper tracking)."""
        self.record.put(placement.key, placement.entry(placement.tracking.recorded()))

    def end(self, placement: Placement) -> None:
        """Undo begin: its cgroups (empty by now) and directory go, its own UID is swept
        (what is left of it said in `applied`, and the UID given up once nothing is), and
        its record goes."""
        private = None
        if placement.private is not None:
            private = placement.applied["private_tmp"] = placement.private.outcome()
        ended: tuple[int, list[int]] | None = None
        if placement.claim is not None and placement.claim.fd >= 0:
            if placement.tracking.kind == CGROUP_V2 and not placement.tracking.alive():
                # No process of the UID can leave its cgroup v2 (moving one takes write
                # access to cgroups that are root's): empty, it held them all and none is
                # left, so the scan of every process's status is spared.
                ended = (0, [])
            else:
                # Before the cgroups go: whatever escaped its tracking may be in them.
                ended = uid_sweep.end_processes(placement.claim.uid)
        for cgroup in reversed(placement.cgroups):
            remove_cgroup(cgroup)
            # The agent's subtree too once no attempt is left in it: nothing stays behind.
            with contextlib.suppress(OSError):
                cgroup.parent.rmdir()
        remove_tree(placement.workdir, as_user=self._removes_as(self._user_of(placement)))
        # Its own /tmp hid the machine's from it, but its working directory lies in the
        # machine's: left behind (a removal that failed), the whole sweep takes it, or keeps
        # the UID while it stays.
        private_only = private == HELD and not os.path.lexists(placement.workdir)
        places = uid_sweep.PRIVATE_SWEPT if private_only else uid_sweep.SHARED_PLACES
        swept = self._sweep(placement, ended, places)
        if swept is not None:
            placement.applied["swept"] = swept.describe()
        self.record.drop(placement.key)

    def _user_of(self, placement: Placement) -> JobUser:
        """Whom PLACEMENT's command ran as."""
        if placement.claim is not None:
            return own_user(placement.claim.uid)
        if placement.named is not None:
            return placement.named
        assert self.user is not None
        return self.user

    def _sweep(
        self,
        placement: Placement,
        ended: tuple[int, list[int]] | None = None,
        places: tuple[Path, ...] = uid_sweep.SHARED_PLACES,
    ) -> uid_sweep.Swept | None:
        """Sweep PLACEMENT's own UID (if it has one; ENDED: its processes are, as
        `end_processes` said) in PLACES; give the UID up if nothing is left."""
        claim = placement.claim
        if claim is None or claim.fd < 0:
            return None
        swept = uid_sweep.sweep(claim.uid, places, ended=ended)
        if swept.clean:
            claim.release()
        else:
            log.warning(
                "attempt %s: uid %d kept (not given to another attempt): %s",
                placement.key,
                claim.uid,
                swept.describe(),
            )
            claim.close()
        return swept

    def _limits(
        self,
        node_id: str,
        key: str,
        limits: Limits,
        made: list[Path],
        procs: list[Path],
        user: JobUser,
    ) -> tuple[dict[str, str], list[tuple[int, int]]]:
        """Apply LIMITS: cgroup files written now (cgroups made are added to MADE and to
        PROCS, to be joined), rlimits returned for the child; what was applied, and how."""
        applied: dict[str, str] = {}
        rlimits: list[tuple[int, int]] = []
        v2_cgroup = made[0] if self.tracking == CGROUP_V2 and made else None
        v2_has: set[str] = set()
        if v2_cgroup is not None:
            with contextlib.suppress(OSError):
                v2_has = set((v2_cgroup / "cgroup.controllers").read_text().split())
        v1_made: dict[str, Path] = {}

        def v1(controller: str) -> Path | None:
            if controller in v1_made:
                return v1_made[controller]
            own = self.v1_own.get(controller)
            if own is None:
                return None
            try:
                cgroup = fresh_cgroup(own / f"{SUBTREE_PREFIX}{node_id}", key, v2=False)
            except OSError as e:
                log.warning("cannot make a %s cgroup in %s: %s", controller, own, e.strerror or e)
                return None
            made.append(cgroup)
            procs.append(cgroup / "cgroup.procs")
            v1_made[controller] = cgroup
            return cgroup

        if limits.memory is not None:
            if "memory" in v2_has and v2_cgroup is not None:
                _write(v2_cgroup / "memory.max", str(limits.memory))
                with contextlib.suppress(OSError):  # swap would stretch the limit
                    _write(v2_cgroup / "memory.swap.max", "0")
                applied["memory"] = CGROUP_V2
            elif (cgroup := v1("memory")) is not None:
                _write(cgroup / "memory.limit_in_bytes", str(limits.memory))
                with contextlib.suppress(OSError):  # no swap accounting: the limit alone
                    _write(cgroup / "memory.memsw.limit_in_bytes", str(limits.memory))
                applied["memory"] = "cgroup v1"
            else:
                applied["memory"] = "not applied: no memory controller"
        if limits.cpu is not None:
            quota = max(1000, int(limits.cpu * CPU_PERIOD_US))
            if "cpu" in v2_has and v2_cgroup is not None:
                _write(v2_cgroup / "cpu.max", f"{quota} {CPU_PERIOD_US}")
                applied["cpu"] = CGROUP_V2
            elif (cgroup := v1("cpu")) is not None:
                _write(cgroup / "cpu.cfs_period_us", str(CPU_PERIOD_US))
                _write(cgroup / "cpu.cfs_quota_us", str(quota))
                applied["cpu"] = "cgroup v1"
            else:
                applied["cpu"] = "not applied: no cpu controller"
        if limits.max_processes is not None:
            if "pids" in v2_has and v2_cgroup is not None:
                _write(v2_cgroup / "pids.max", str(limits.max_processes))
                applied["max_processes"] = CGROUP_V2
            elif (cgroup := v1("pids")) is not None:
                _write(cgroup / "pids.max", str(limits.max_processes))
                applied["max_processes"] = "cgroup v1"
            elif user.uid == 0:
                applied["max_processes"] = (
                    "not applied: no pids controller, and root has no process rlimit"
                )
            else:
                rlimits.append((resource.RLIMIT_NPROC, limits.max_processes))
                applied["max_processes"] = (
                    "rlimit (its own uid: this attempt's processes)"
                    if self.uids is not None
                    else f"rlimit (per user: counts every process of {user.name})"
                )
        if limits.max_open_files is not None:
            rlimits.append((resource.RLIMIT_NOFILE, limits.max_open_files))
            applied["max_open_files"] = "rlimit"
        if limits.address_space is not None:
            rlimits.append((resource.RLIMIT_AS, limits.address_space))
            applied["address_space"] = "rlimit"
        for name in limits.unknown:
            applied[name] = "not applied: this node does not know it"
        return applied, rlimits

    # --- what a previous agent process left ----------------------------------------------

    def end_leftovers(self, node_id: str | None) -> int:
        """End the processes of the attempts a previous agent process left running (killed
        with -9, crashed), remove their cgroups and directories; how many attempts."""
        ended = 0
        entries = self.record.load()
        for key, entry in entries.items():
            processes, removed = end_recorded(entry)
            log.info(
                "attempt %s of a previous agent process: ended %d process(es)%s",
                key,
                processes,
                f", removed {removed}" if removed is not None else "",
            )
            ended += 1
        subtree = self.subtree(node_id) if node_id is not None else None
        if subtree is not None and subtree.is_dir():
            for cgroup in sorted(p for p in subtree.iterdir() if p.is_dir()):
                # An attempt with a directory of its own under DIR/attempts/ has a supervisor
                # (supervisor.py): alive, it runs on; dead, its tracking.json says what to end.
                if cgroup.name in entries or (self.data_dir / ATTEMPTS_DIR / cgroup.name).is_dir():
                    continue
                processes = end_cgroup(cgroup)
                log.info(
                    "attempt %s of a previous agent process: ended %d process(es) in %s",
                    cgroup.name,
                    processes,
                    cgroup,
                )
                ended += 1
        if entries:
            self.record.path.unlink(missing_ok=True)
        return ended


def end_recorded(entry: Mapping[str, object]) -> tuple[int, Path | None]:
    """End what ENTRY (one attempt's record: workdir, cgroups, [PID, start time] pairs)
    says is left of an attempt: its cgroups' processes, its recorded processes that are
    still the ones recorded (never a process that reused a PID), its directory. How many
    processes, and the directory removed (or None)."""
    processes = 0
    for raw in _strings(entry.get("cgroups")):
        path = Path(raw)
        if _is_attempt_cgroup(path):
            processes += end_cgroup(path)
    pairs = entry.get("pids")
    for pair in pairs if isinstance(pairs, list) else []:
        if (
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(n, int) and not isinstance(n, bool) for n in pair)
            and pair[0] > 1
            and procfs.same_process(pair[0], pair[1]) is not None
        ):
            signal_quietly(pair[0], signal.SIGKILL)
            processes += 1
    removed = None
    workdir = entry.get("workdir")
    if isinstance(workdir, str) and Path(workdir).name.startswith(WORKDIR_PREFIX):
        path = Path(workdir)
        if path.is_absolute() and path.is_dir() and not path.is_symlink():
            remove_tree(path)
            removed = path
    uid, claims = entry.get("uid"), entry.get("uid_claims")
    if isinstance(uid, int) and not isinstance(uid, bool) and isinstance(claims, str):
        # Swept only if no live supervisor holds it (given again meanwhile: another's).
        swept = UidClaims(directory=Path(claims)).reclaim(uid, uid_sweep.sweep)
        if swept is not None:
            log.info("uid %d of a dead supervisor's attempt: %s", uid, swept.describe())
    return processes, removed


def _strings(value: object) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _is_attempt_cgroup(path: Path) -> bool:
    """A cgroup directory this agent makes for attempts: <cgroup fs>/.../oz0-node-X/job-..."""
    return (
        path.is_absolute()
        and path.parent.name.startswith(SUBTREE_PREFIX)
        and path.name.startswith(("job-", "session-"))
        and (path / "cgroup.procs").is_file()
    )


def _place_file(staged: Path, dest: Path, user: JobUser | None) -> None:
    """A copy of STAGED at DEST (a fresh working directory's: nothing of the job runs yet),
    0600 and USER's (None: the agent's own, jobs run as it)."""
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with staged.open("rb") as source:
            while block := source.read(1 << 20):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view) :]
        if user is not None:
            os.fchown(fd, user.uid, user.gid)
    finally:
        os.close(fd)
