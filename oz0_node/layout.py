"""What a node's data directory DIR holds (docs/manage-nodes.md, "The data directory"):

    identity/   keys, certificates, node.json (identity.py)
    python/     what the one-file agent unpacks to run (its bootstrap's)
    plugins/    executables run alongside the runtime (plugins.py)
    tools/      helper programs, first on PATH for plugins (and for jobs run as the agent's user)
    logs/       the plugins' output
    attempts/   one directory per job attempt, kept by its supervisor (jobs/supervisor.py;
                its files: jobs/attempt_files.py)
    status.json, agent.lock, purge-nonces, attempts-run, created-parents, attempts.json: the
    agent's own

Everything the node has is in DIR, so a purge that deletes DIR removes the node.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path

from oz0_common import strict_modes

log = logging.getLogger(__name__)

PLUGINS_DIR = "plugins"
TOOLS_DIR = "tools"
LOGS_DIR = "logs"


def tools_dir(data_dir: Path) -> Path:
    return data_dir / TOOLS_DIR


def tools_refusal(data_dir: Path) -> str | None:
    """Why DIR/tools/ may not go on PATH (strict modes, oz0_common.strict_modes), or None.
    PATH is searched by the job's shell, not by us, so one bad entry refuses the whole
    directory. A missing tools/ is judged by DIR (or what exists above it)."""
    tools = tools_dir(data_dir)
    try:
        entries = sorted(tools.iterdir())
    except FileNotFoundError:
        # Judged by the nearest directory that exists: only who may write it can make tools/.
        existing = data_dir
        while not os.path.lexists(existing):
            existing = existing.parent
        return strict_modes.refusal(existing)
    except OSError as e:
        return f"{tools} cannot be read: {e.strerror or e}"
    why = strict_modes.refusal(tools)
    for entry in entries:
        if why is not None:
            break
        why = strict_modes.refusal(entry, parents=False)
    return why


# The refusals logged already: a bad tools/ is said once, not at every job's start.
_said: set[str] = set()


def with_tools_on_path(env: Mapping[str, str], data_dir: Path) -> dict[str, str]:
    """ENV with DIR/tools/ first on PATH: the helper programs a node offers its jobs; ENV as
    it is (and one warning) when tools/ fails strict modes."""
    tools, rest = str(tools_dir(data_dir)), env.get("PATH", os.defpath)
    why = tools_refusal(data_dir)
    if why is not None:
        if why not in _said:
            _said.add(why)
            log.warning("tools %s refused, not put on PATH: %s", tools, why)
        return dict(env)
    return {**env, "PATH": f"{tools}{os.pathsep}{rest}" if rest else tools}
