"""Where a server's log lines go: the console, and with a log directory its files.

Temporal's own lines come through oz0.temporal.host_logs on TEMPORAL_LOGGER; with a log
directory they go to a file of their own.
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

from oz0.temporal.host_logs import TEMPORAL_LOGGER

SERVER_LOG = "server.log"
TEMPORAL_LOG = "temporal.log"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Only(logging.Filter):
    def __init__(self, name: str, *, keep: bool) -> None:
        super().__init__()
        self._name, self._keep = name, keep

    def filter(self, record: logging.LogRecord) -> bool:
        ours = record.name == self._name or record.name.startswith(self._name + ".")
        return ours == self._keep


def _private_file(path: Path) -> logging.FileHandler:
    # Log lines name nodes, addresses and operators: readable by the server's user only.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    return logging.FileHandler(path, encoding="utf-8")


def configure(*, verbose: bool = False, log_dir: Path | None = None) -> None:
    """Log to stderr; with LOG_DIR, also to LOG_DIR/server.log and LOG_DIR/temporal.log.

    With a log directory the console shows only warnings and errors of our own (the
    directory holds the rest, Temporal's lines among them); without one, our INFO lines
    and Temporal's in our format. VERBOSE puts every line on the console.
    """
    # platformdirs warns about XDG_RUNTIME_DIR when the embedded PostgreSQL is imported.
    warnings.filterwarnings("ignore", module="platformdirs")
    # The pool warns at every failed reconnection attempt; our loops say once per outage
    # that the database is unavailable (oz0.store.outage), so only its errors matter.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
    root = logging.getLogger()
    if root.handlers:
        # Like logging.basicConfig: whoever set up logging before us (a test runner
        # calling the command in its own process) keeps it.
        return
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(logging.Formatter(FORMAT))
    if log_dir is not None:
        log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        server_file = _private_file(log_dir / SERVER_LOG)
        server_file.setFormatter(logging.Formatter(FORMAT))
        server_file.addFilter(_Only(TEMPORAL_LOGGER, keep=False))
        temporal_file = _private_file(log_dir / TEMPORAL_LOG)
        temporal_file.setFormatter(logging.Formatter("%(message)s"))
        temporal_file.addFilter(_Only(TEMPORAL_LOGGER, keep=True))
        for handler in (server_file, temporal_file):
            handler.setLevel(logging.INFO)
            root.addHandler(handler)
        if not verbose:
            console.setLevel(logging.WARNING)
            # Temporal logs routine events as warnings and errors (a missing Nexus port,
            # queue readers retrying while shards load): its file holds them.
            console.addFilter(_Only(TEMPORAL_LOGGER, keep=False))
    root.addHandler(console)
