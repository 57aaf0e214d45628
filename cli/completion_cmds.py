"""`orchestrator-zero --install-completion`: shell completion of commands, flags and the
cluster's IDs, in bash, zsh and fish (docs/run-a-cluster.md, "Shell completion").

cyclopts writes the script (`App.generate_completion`) and installs it
(`App.install_completion`: the script where the shell looks for it, and for bash and zsh
the line in ~/.bashrc or ~/.zshrc that loads it). The script holds the commands and flags
of this release (install it again after an upgrade) and asks `orchestrator-zero __complete`
for the IDs (cli/completers.py). Imported only when this command runs.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Literal

from cyclopts import Parameter

from cli.output import print_json
from cli.params import Flag, JsonFlag
from oz0.errors import Oz0Error

Shell = Literal["bash", "zsh", "fish"]
SHELLS: tuple[Shell, ...] = ("bash", "zsh", "fish")
_LOADED_BY = {
    "bash": "~/.bashrc loads it: open a new shell, or run `source ~/.bashrc`",
    "zsh": "~/.zshrc adds its directory to fpath (your .zshrc must run compinit after"
    " that line, as most do): open a new shell",
    "fish": "fish loads it by itself: open a new shell",
}


def install_completion(
    *,
    shell: Shell | None = None,
    output: Annotated[Path | None, Parameter(name="--output")] = None,
    print_script: Annotated[Flag, Parameter(name="--print")] = False,
    json: JsonFlag = False,
) -> int:
    """Install completion of commands, flags and the cluster's node, job, token, schedule
    and tenant IDs in your shell.

    Parameters
    ----------
    shell
        bash, zsh or fish (default: the shell this runs in).
    output
        Where to write the script (default: where the shell looks for it); nothing then
        loads it but what you add yourself.
    print_script
        Print the script instead, for a system-wide file (such as
        /etc/bash_completion.d/orchestrator-zero); nothing is installed.
    """
    from cli.main import app

    chosen = shell or _detected()
    if print_script:
        sys.stdout.write(app.generate_completion(shell=chosen))
        return 0
    try:
        path = app.install_completion(shell=chosen, output=output, add_to_startup=output is None)
    except OSError as e:
        raise Oz0Error(f"cannot install the {chosen} completion: {e.strerror or e}") from None
    if json:
        print_json({"shell": chosen, "script": str(path), "loaded_at_start": output is None})
        return 0
    print(f"{chosen} completion written to {path}")
    print(_LOADED_BY[chosen] if output is None else f"load {path} from your shell's start-up")
    return 0


def _detected() -> Shell:
    from cyclopts.completion import ShellDetectionError, detect_shell

    try:
        found = detect_shell()
    except ShellDetectionError:
        found = None
    if found not in SHELLS:
        raise Oz0Error("cannot tell which shell this is: give --shell bash, zsh or fish")
    return found
