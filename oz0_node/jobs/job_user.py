"""As whom an attempt runs: when the agent is root, a UID of the attempt's own
(attempt_uids.py) unless `--job-user NAME` names an account (all of that account's jobs
share it: weaker), `root` only when named; an agent that is not root runs jobs as itself.
Also the agent's private directories, which no job may read (docs/manage-nodes.md, "What a
job can reach")."""

from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from oz0_node.errors import AgentError

log = logging.getLogger(__name__)

# The account `--job-user` names in the docs' examples (and the tests': fixtures/job_user.py).
DEFAULT_JOB_USER = "oz0-job"


@dataclass(frozen=True)
class JobUser:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]

    @classmethod
    def named(cls, name: str) -> JobUser | None:
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        # That user's own groups only, never the agent's.
        groups = tuple(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

    @classmethod
    def of_agent(cls) -> JobUser:
        uid = os.geteuid()
        try:
            name = pwd.getpwuid(uid).pw_name
        except KeyError:
            name = str(uid)
        return cls(name, uid, os.getegid(), tuple(os.getgroups()))


def resolve_job_user(requested: str | None, *, euid: int | None = None) -> JobUser | None:
    """The account jobs run as, or None when each attempt runs as a UID of its own (root,
    no `--job-user`); see the module's docstring. AgentError when it cannot be."""
    euid = os.geteuid() if euid is None else euid
    agent = JobUser.of_agent()
    if euid != 0:
        if requested is not None and requested not in (agent.name, str(agent.uid)):
            raise AgentError(
                f"--job-user {requested}: only an agent running as root can run jobs as "
                f"another user; this one runs as {agent.name}, and so do its jobs"
            )
        return agent
    if requested is None:
        return None
    user = JobUser.named(requested)
    if user is None:
        raise AgentError(
            f"the job user {requested} does not exist, so no job can run: create it, or "
            "leave --job-user out (each attempt then runs as a UID of its own)"
        )
    return user


def own_user(uid: int) -> JobUser:
    """An attempt's own UID as the user it runs as: no account, its group of the same
    number and no other (USER and LOGNAME say oz0-uid-UID)."""
    return JobUser(f"oz0-uid-{uid}", uid, uid, ())


def check_private(paths: list[Path], *, enforce: bool) -> None:
    """Each of PATHS (if it exists) owned by the agent's user and closed to group and others.

    ENFORCE (root): a mode that lets others in is set to 0700. Otherwise (an agent whose jobs
    run as itself) refuse: such a directory would let other users of the machine in."""
    euid = os.geteuid()
    for path in paths:
        try:
            info = path.stat()  # a data directory may be a link to one: what it names
        except FileNotFoundError:
            continue
        except OSError as e:
            raise AgentError(f"cannot check {path}: {e.strerror or e}") from None
        if not stat.S_ISDIR(info.st_mode):
            raise AgentError(f"{path} must be a directory")
        if info.st_uid != euid:
            raise AgentError(
                f"{path} is owned by uid {info.st_uid}, not by the agent's user ({euid}): "
                "no job runs until it is (chown it, or use another --data-dir)"
            )
        if info.st_mode & 0o077:
            if not enforce:
                raise AgentError(
                    f"{path} is open to group or others (mode {stat.S_IMODE(info.st_mode):o}): "
                    f"no job runs until it is closed (chmod 0700 {path})"
                )
            path.chmod(0o700)
            log.info("%s was open to group or others: now 0700", path)
