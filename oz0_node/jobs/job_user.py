"""As whom an attempt runs: the job user (`--job-user`, default `oz0-job`, made by
`oz0-node install-service`) when the agent is root, else the agent's own user; and the
agent's private directories, which no job user may read (docs/manage-nodes.md, "What a job
can reach")."""

from __future__ import annotations

import logging
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from oz0_node import service
from oz0_node.errors import AgentError

log = logging.getLogger(__name__)

DEFAULT_JOB_USER = service.DEFAULT_JOB_USER


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


def resolve_job_user(requested: str | None, *, euid: int | None = None) -> JobUser:
    """The user jobs run as (see the module's docstring); AgentError when it cannot be."""
    euid = os.geteuid() if euid is None else euid
    agent = JobUser.of_agent()
    if euid != 0:
        if requested is not None and requested not in (agent.name, str(agent.uid)):
            raise AgentError(
                f"--job-user {requested}: only an agent running as root can run jobs as "
                f"another user; this one runs as {agent.name}, and so do its jobs"
            )
        return agent
    name = requested or DEFAULT_JOB_USER
    user = JobUser.named(name)
    if user is None:
        hint = (
            "run `oz0-node install-service` (which creates it) or `useradd --system "
            f"--no-create-home --shell /usr/sbin/nologin {name}`, or give --job-user NAME"
            if requested is None
            else "create it, or give another --job-user"
        )
        raise AgentError(f"the job user {name} does not exist, so no job can run: {hint}")
    return user


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
