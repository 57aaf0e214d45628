"""Strict modes, as sshd's StrictModes: what a node runs of its own accord (a plugin, a tool,
the Python the one-file agent unpacked) must be owned by the agent's user or root and
writable by nobody else, and so must every directory above it up to `/` and, through a
symbolic link, the link's target and every directory above that. Anyone who could write
one of them could otherwise make the agent run code of their choosing as its user (root,
for a machine-wide node). docs/manage-nodes.md, "Strict modes".

One exception, as for /tmp: a directory writable by others is accepted when it has the
sticky bit (and a good owner), since nobody else can then rename or delete what is ours.

Standard library only: the one-file agent's bootstrap carries a copy (as
`_oz0_strict_modes`, oz0/agent_file/build.py) to check its data directory before anything
is unpacked or run.
"""

from __future__ import annotations

import os
import pwd
import stat
from pathlib import Path

_GROUP_OTHERS = stat.S_IWGRP | stat.S_IWOTH


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def entry_refusal(path: Path, st: os.stat_result, euid: int) -> str | None:
    """Why the entry PATH, whose status is ST, is unsafe (its owner or its mode), or None.
    A symbolic link is judged by its owner alone: its own mode means nothing."""
    if st.st_uid not in (0, euid):
        return (
            f"{path} is owned by {_user(st.st_uid)}, not by root or the agent's user "
            f"{_user(euid)}; chown it"
        )
    if stat.S_ISLNK(st.st_mode):
        return None
    writable = st.st_mode & _GROUP_OTHERS
    if not writable or (stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX):
        return None
    who, letters = {
        stat.S_IWGRP: ("group", "g"),
        stat.S_IWOTH: ("others", "o"),
    }.get(writable, ("group and others", "go"))
    return (
        f"{path} is writable by {who} (mode {stat.S_IMODE(st.st_mode):04o}); chmod {letters}-w it"
    )


def _chain_refusal(path: Path, euid: int, *, parents: bool, follow: bool) -> str | None:
    chain = (path, *path.parents) if parents else (path,)
    for entry in chain:
        try:
            st = entry.stat() if follow else entry.lstat()
        except OSError as e:
            return f"{entry} cannot be checked: {e.strerror or e}"
        why = entry_refusal(entry, st, euid)
        if why is not None:
            return why
    return None


def refusal(path: Path, *, parents: bool = True, euid: int | None = None) -> str | None:
    """Why PATH may not be run or trusted (one phrase naming the path at fault and the fix),
    or None when it is safe. PARENTS=False: the directories above PATH are known safe
    already (the entries of one checked directory), only PATH and, if it is a link, where
    it leads (all the way up) are checked."""
    uid = os.geteuid() if euid is None else euid
    named = path.absolute()
    # The path as named, each entry itself (who could replace it), then, if any link is on
    # the way, the path it really leads to and the directories above that.
    why = _chain_refusal(named, uid, parents=parents, follow=False)
    if why is not None:
        return why
    resolved = Path(os.path.realpath(named))
    if resolved == named:
        return None
    why = _chain_refusal(resolved, uid, parents=True, follow=True)
    return None if why is None else f"{why} (reached through {named})"
