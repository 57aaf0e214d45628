"""The agent as one file (`oz0-node`): built by build.py, started by bootstrap.py, served
by every server (oz0.server.api.agent_file).

Its modules:

- `digest.py`: the served agent file's SHA-256, computed once per version of the file: the
  download's `.sha256` and every join command (oz0.server.join_command) give the same one.
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_ENV = "OZ0_AGENT_FILE"
FILE_NAME = "oz0-node"
_BUILT = Path(__file__).resolve().parent / "bin" / FILE_NAME


def agent_file() -> Path:
    """The file servers serve: $OZ0_AGENT_FILE, else the one built at install."""
    return Path(os.environ.get(FILE_ENV) or _BUILT)


def missing_advice(path: Path) -> str:
    return (
        f"the agent file {path} is not built; run `python3 -m nox -s agent` and copy "
        f"dist/oz0-node there, or reinstall orchestrator-zero (setup.py builds it)"
    )
