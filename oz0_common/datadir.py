"""Where a node agent keeps everything it has: the one rule, for the agent and whatever
starts it (the one-file bootstrap unpacks its Python into the same directory).

`--data-dir`, else OZ0_NODE_DATA_DIR, else /var/lib/oz0-node for root and
~/.local/share/oz0-node for anyone else (docs/manage-nodes.md, "The data directory").
"""

from __future__ import annotations

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
