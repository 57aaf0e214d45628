"""Where a node keeps everything: --data-dir, else $OZ0_NODE_DATA_DIR, else a default.

Standard library only: the agent file's bootstrap runs this before anything is unpacked
(it carries a copy of this file, not the package), so the rule lives here once."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

DATA_DIR_ENV = "OZ0_NODE_DATA_DIR"
ROOT_DEFAULT = Path("/var/lib/oz0-node")
USER_DEFAULT = Path("~/.local/share/oz0-node")


def default_data_dir(environ: Mapping[str, str] | None = None) -> Path:
    """$OZ0_NODE_DATA_DIR, else /var/lib/oz0-node for root, ~/.local/share/oz0-node otherwise."""
    env = os.environ if environ is None else environ
    if env.get(DATA_DIR_ENV):
        return Path(env[DATA_DIR_ENV]).expanduser().absolute()
    if os.geteuid() == 0:
        return ROOT_DEFAULT
    home = env.get("HOME") or str(Path.home())
    return (Path(home) / ".local" / "share" / "oz0-node").absolute()


def data_dir_from(argv: Sequence[str], environ: Mapping[str, str] | None = None) -> Path:
    """The data directory a command line names (`--data-dir DIR` or `--data-dir=DIR`; the
    last one wins, as the agent's parser takes it), else the default."""
    found: str | None = None
    for i, arg in enumerate(argv):
        if arg == "--data-dir" and i + 1 < len(argv):
            found = argv[i + 1]
        elif arg.startswith("--data-dir="):
            found = arg.split("=", 1)[1]
    if found:
        return Path(found).expanduser().absolute()
    return default_data_dir(environ)
