"""The root of `orchestrator-zero`; each command group lives in a module of its own.

A group's module is imported only when a command line names the group (cyclopts loads it
from its import path), so `--help` and every command load only what they use: a client
command never loads the server, which only `server ...` commands import, inside them
(tests/test_cli_imports.py). The groups' one-line help is here, for `--help` to show
without importing them.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cyclopts import App

from oz0 import __version__
from oz0_common.commands import run_command

app = App(
    name="orchestrator-zero",
    help="Run a fleet of nodes from a cluster of servers.",
    version=__version__,
    # The root's help is one sentence and a list, the same in plain text; Markdown (which
    # the groups' docstrings use, and say so) would load its renderer at every --help.
    help_format="plaintext",
)
app.command(
    "cli.server_cmds:app",
    name="server",
    help="Create, start and administer the cluster's servers.",
)
app.command("cli.cluster_cmds:app", name="cluster", help="The cluster as a whole.")
app.command(
    "cli.operator_cmds:app",
    name="operator",
    help="People: add, enroll, list, change and remove operators; renew your own.",
)
app.command("cli.node_cmds:app", name="node", help="The fleet's nodes.")
app.command(
    "cli.tenant_cmds:app",
    name="tenant",
    help="Tenants: each runs its work in a Temporal namespace of its name.",
)
app.command(
    "cli.token_cmds:app",
    name="token",
    help="Join tokens: a node joining with one is accepted at once.",
)
app.command("cli.audit_cmds:app", name="audit", help="The audit log of every change.")
app.command(
    "cli.session_cmds:app",
    name="session",
    help="Sessions on nodes (node shell, node exec): list them, play their recordings.",
)
# Through its meta app, which checks that `job run` has its `--` (see job_cmds).
app.command("cli.job_cmds:meta", name="job", help="Jobs: commands run on the fleet's nodes.")
app.command("cli.file_cmds:app", name="file", help="Files put on the fleet's nodes.")
app.command(
    "cli.schedule_cmds:meta",
    name="schedule",
    help="Schedules: jobs run on a cron or an interval (Temporal Schedules).",
)
# The script is cyclopts's; the live IDs it completes come from cli/completers.py.
app.command(
    "cli.completion_cmds:install_completion",
    name="--install-completion",
    help="Install completion of commands, flags and the cluster's IDs in bash, zsh or fish.",
    help_format="markdown",
)


def run(tokens: Sequence[str]) -> int:
    return run_command(app, tokens)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
