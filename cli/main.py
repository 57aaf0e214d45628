"""The root of `orchestrator-zero`; each command group lives in a module of its own."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cyclopts import App

from cli import (
    audit_cmds,
    cluster_cmds,
    job_cmds,
    node_cmds,
    operator_cmds,
    server_cmds,
    tenant_cmds,
    token_cmds,
)
from oz0 import __version__
from oz0_common.commands import run_command

app = App(
    name="orchestrator-zero",
    help="Run a fleet of nodes from a cluster of servers.",
    version=__version__,
)
app.command(server_cmds.app)
app.command(cluster_cmds.app)
app.command(operator_cmds.app)
app.command(node_cmds.app)
app.command(tenant_cmds.app)
app.command(token_cmds.app)
app.command(audit_cmds.app)
# Through its meta app, which checks that `job run` has its `--` (see job_cmds).
app.command(job_cmds.app.meta, name="job")


def run(tokens: Sequence[str]) -> int:
    return run_command(app, tokens)


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
