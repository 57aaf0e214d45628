"""The root of `orchestrator-zero`; each command group lives in a module of its own."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from cyclopts import App, CycloptsError

from cli import (
    audit_cmds,
    cluster_cmds,
    node_cmds,
    operator_cmds,
    server_cmds,
    tenant_cmds,
    token_cmds,
)
from oz0 import __version__
from oz0.errors import Oz0Error

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


def run(tokens: Sequence[str]) -> int:
    """Run one command; every failure becomes one line on stderr and a non-zero code."""
    try:
        result = app(
            list(tokens), exit_on_error=False, print_error=False, result_action="return_value"
        )
    except CycloptsError as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except Oz0Error as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0


def _one_line(message: str) -> str:
    return " ".join(message.split())


def main() -> None:
    sys.exit(run(sys.argv[1:]))


if __name__ == "__main__":
    main()
