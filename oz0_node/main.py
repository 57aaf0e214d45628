"""`oz0-node`: the agent a node machine runs. Joining and control streams come next."""

from __future__ import annotations

import sys

from cyclopts import App

from oz0 import __version__

app = App(name="oz0-node", help="The orchestrator-zero node agent.", version=__version__)


def main() -> None:
    app(sys.argv[1:])
