"""What a node's data directory DIR holds (docs/manage-nodes.md, "The data directory"):

    identity/   keys, certificates, node.json (identity.py)
    python/     what the one-file agent unpacks to run (its bootstrap's)
    plugins/    executables run alongside the runtime (plugins.py)
    tools/      helper programs, first on PATH for plugins (and for jobs run as the agent's user)
    logs/       the plugins' output
    status.json, agent.lock, purge-nonces, attempts-run, created-parents, attempts.json: the
    agent's own

Everything the node has is in DIR, so a purge that deletes DIR removes the node.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

PYTHON_DIR = "python"
PLUGINS_DIR = "plugins"
TOOLS_DIR = "tools"
LOGS_DIR = "logs"


def tools_dir(data_dir: Path) -> Path:
    return data_dir / TOOLS_DIR


def with_tools_on_path(env: Mapping[str, str], data_dir: Path) -> dict[str, str]:
    """ENV with DIR/tools/ first on PATH: the helper programs a node offers its jobs."""
    tools, rest = str(tools_dir(data_dir)), env.get("PATH", os.defpath)
    return {**env, "PATH": f"{tools}{os.pathsep}{rest}" if rest else tools}
