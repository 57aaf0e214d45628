"""Where a node agent keeps everything it has: the one rule, for the agent and whatever
starts it (the one-file bootstrap unpacks its Python into the same directory).

`--data-dir`, else OZ0_NODE_DATA_DIR, else /var/lib/oz0-node for root and
~/.local/share/oz0-node for anyone else (docs/manage-nodes.md, "The data directory").
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

ENV_VAR = "OZ0_NODE_DATA_DIR"
ROOT_DEFAULT = Path("/var/lib/oz0-node")
USER_DEFAULT = Path(".local", "share", "oz0-node")  # under the user's home


def node_data_dir(
    given: str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    euid: int | None = None,
) -> Path:
    """The node's data directory, absolute (not resolved: a purge never deletes through a
    symbolic link, so the path must stay the one the operator named)."""
    env = os.environ if environ is None else environ
    if given is not None and str(given) != "":
        chosen = Path(given)
    elif env.get(ENV_VAR):
        chosen = Path(env[ENV_VAR])
    elif (os.geteuid() if euid is None else euid) == 0:
        chosen = ROOT_DEFAULT
    else:
        home = env.get("HOME")
        chosen = (Path(home) if home else Path.home()) / USER_DEFAULT
    return chosen.expanduser().absolute()


def data_dir_in_argv(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Path:
    """The data directory a command line names (`--data-dir DIR` or `--data-dir=DIR`; the
    last wins, as the agent's parser takes it), else the default. The one-file bootstrap
    needs it before anything is unpacked, so before the agent's parser exists."""
    found: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--data-dir" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--data-dir="):
            found = arg.split("=", 1)[1]
    return node_data_dir(found, environ=environ)


CREATED_PARENTS_FILE = "created-parents"


def make_data_dir(data_dir: Path) -> None:
    """Make DATA_DIR (0700: it holds the node's keys) unless it exists; the directories
    above it that this makes are listed in DATA_DIR/created-parents (0600), so a purge
    removes them too, each only if empty. Whichever starts first makes it, the one-file
    bootstrap or the agent: both call this. Raises OSError."""
    made: list[Path] = []
    above = data_dir.parent
    while not os.path.lexists(above):
        made.append(above)
        above = above.parent
    existed = os.path.lexists(data_dir)
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    if made and not existed:
        listed = json.dumps([str(p) for p in made], indent=2) + "\n"
        fd = os.open(data_dir / CREATED_PARENTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(listed)
