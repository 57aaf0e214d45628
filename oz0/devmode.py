"""`--dev`: a whole cluster in one directory, on an embedded PostgreSQL 16."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from oz0.context import Context, ContextError
from oz0.store.dburl import DatabaseUrl

log = logging.getLogger(__name__)

DEV_CLUSTER = "dev"
DEV_HISTORY_SHARDS = 4
DATABASE = "oz0"


def master_key_path(data_dir: Path) -> Path:
    return data_dir / "master.key"


def context_dir(data_dir: Path) -> Path:
    return data_dir / "context"


def log_dir(data_dir: Path) -> Path:
    """The server's and its Temporal host's log files (see oz0.server.logs)."""
    return data_dir / "logs"


def visibility_sqlite(data_dir: Path) -> Path:
    """Temporal's visibility store in dev: the pgserver build lacks the btree_gin extension
    Temporal's PostgreSQL visibility schema needs."""
    directory = data_dir / "temporal"
    directory.mkdir(mode=0o700, exist_ok=True)
    return directory / "visibility.db"


def server_address(data_dir: Path) -> str:
    """Where the dev cluster's first context points: its server's management address."""
    try:
        return Context.load(context_dir(data_dir)).servers[0]
    except (ContextError, IndexError):
        return "127.0.0.1"


@contextmanager
def embedded_postgres(data_dir: Path) -> Iterator[DatabaseUrl]:
    """The data directory's PostgreSQL, started if it is not running, stopped on exit
    unless another process still uses it."""
    from pgserver import get_server  # type: ignore[attr-defined]

    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    server = get_server(data_dir / "postgres", cleanup_mode="stop")
    try:
        yield DatabaseUrl.parse(server.get_uri(DATABASE))
    finally:
        server.cleanup()
