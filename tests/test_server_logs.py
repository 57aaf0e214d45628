"""Where a server's log lines go (oz0.server.logs), without a server."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from oz0.server import logs
from oz0.temporal import host_logs

NEXUS = (
    '{"level":"warn","ts":"2026-12-01T11:52:29.123Z","msg":"HTTP API port has not been set.'
    ' Nexus HTTP endpoints will not be available.","service":"frontend"}'
)


@contextmanager
def configured(**options: Any) -> Iterator[None]:
    """logs.configure(**OPTIONS) as in a server's process, where nobody set up logging
    before; what it did is undone at the end (pytest's own handlers come back)."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    pool = logging.getLogger("psycopg.pool")
    pool_level = pool.level
    root.handlers[:] = []
    try:
        logs.configure(**options)
        yield
    finally:
        for handler in root.handlers:
            handler.close()
        root.handlers[:] = handlers
        root.setLevel(level)
        pool.setLevel(pool_level)


@pytest.mark.parametrize(
    ("line", "level"),
    [
        (NEXUS, logging.WARNING),
        ('{"level":"error","msg":"x"}', logging.ERROR),
        ('{"level":"info","msg":"x"}', logging.INFO),
        ('{"level":"fatal","msg":"x"}', logging.CRITICAL),
        ('{"level":"odd","msg":"x"}', logging.WARNING),
        ("panic: runtime error: index out of range", logging.ERROR),
        ("[1, 2]", logging.ERROR),
    ],
)
def test_temporal_levels_become_ours(line: str, level: int) -> None:
    assert host_logs.level_of(line) == level


def emit_some() -> None:
    ours = logging.getLogger("oz0.server.edge")
    ours.info("edge listening")
    ours.warning("something to see")
    logging.getLogger("pgserver").info("Running commandline: initdb")
    host_logs.host_line(NEXUS)


def test_with_a_log_directory_the_console_shows_only_our_warnings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with configured(log_dir=tmp_path / "logs"):
        emit_some()
        console = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 2)[2] for line in console] == [
        "WARNING oz0.server.edge: something to see"
    ]
    server = (tmp_path / "logs" / "server.log").read_text().splitlines()
    assert [line.split(" ", 2)[2] for line in server] == [
        "INFO oz0.server.edge: edge listening",
        "WARNING oz0.server.edge: something to see",
        "INFO pgserver: Running commandline: initdb",
    ]
    assert (tmp_path / "logs" / "temporal.log").read_text() == NEXUS + "\n"
    assert (tmp_path / "logs").stat().st_mode & 0o777 == 0o700
    for name in ("server.log", "temporal.log"):
        assert (tmp_path / "logs" / name).stat().st_mode & 0o777 == 0o600


def test_verbose_shows_everything_on_the_console(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with configured(verbose=True, log_dir=tmp_path / "logs"):
        emit_some()
        logging.getLogger("oz0.server.edge").debug("a detail")
        console = [line.split(" ", 2)[2] for line in capsys.readouterr().err.splitlines()]
    assert console == [
        "INFO oz0.server.edge: edge listening",
        "WARNING oz0.server.edge: something to see",
        "INFO pgserver: Running commandline: initdb",
        f"WARNING oz0.temporal.host: {NEXUS}",
        "DEBUG oz0.server.edge: a detail",
    ]
    assert (tmp_path / "logs" / "temporal.log").read_text() == NEXUS + "\n"


def test_without_a_log_directory_temporal_lines_come_in_our_format(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with configured():
        emit_some()
        logging.getLogger("oz0.server.edge").debug("a detail")
        console = [line.split(" ", 2)[2] for line in capsys.readouterr().err.splitlines()]
    assert console == [
        "INFO oz0.server.edge: edge listening",
        "WARNING oz0.server.edge: something to see",
        "INFO pgserver: Running commandline: initdb",
        f"WARNING oz0.temporal.host: {NEXUS}",
    ]


def test_logging_set_up_before_is_left_alone() -> None:
    root = logging.getLogger()
    before = list(root.handlers)
    assert before, "pytest's own handlers"
    logs.configure(verbose=True)
    assert root.handlers == before
