"""What a new user meets first: a dev start that prints only what matters, and a context
that follows the servers that are up.

Addresses: 127.0.0.215 and 127.0.0.216.
"""

from __future__ import annotations

import datetime as dt
import os
import signal
from pathlib import Path

import pytest

from cli.client import ApiClient
from fixtures.cluster import REPO, ClusterFiles, ServerProcess, StartServer, cli_command, initialise
from oz0 import pki
from oz0.context import Context
from oz0.store.dburl import DatabaseUrl
from tests.conftest import CliRunner

FIRST, SECOND = "127.0.0.215", "127.0.0.216"


def dev_server(data_dir: Path, workdir: Path, *extra: str) -> ServerProcess:
    env = dict(os.environ)
    env.pop("OZ0_DB", None)
    env.update(TMPDIR=str(workdir / "tmp"), HOME=str(workdir / "home"), PYTHONPATH=str(REPO))
    args = cli_command(
        "server", "start", "--dev", "--data-dir", str(data_dir), "--advertise", FIRST, *extra
    )
    return ServerProcess(args=args, env=env, cwd=workdir)


@pytest.mark.slow
def test_a_dev_start_prints_what_matters_and_logs_the_rest(tmp_path: Path) -> None:
    data_dir = tmp_path / "dev"
    logs = data_dir / "logs"
    first = dev_server(data_dir, tmp_path / "run1")
    try:
        first.start(ready="export OZ0_CONTEXT=")
        lines = [line.rstrip("\n") for line in first.stdout_lines]
        expected = [
            "server server-",
            "web UI:    https://127.0.0.215:8443",
            "web UI account admin, password ",
            "CA hash:   sha256:",
            f"logs:      {logs}  (--verbose prints them here)",
            f"export OZ0_CONTEXT={data_dir / 'context' / 'context.json'}",
        ]
        assert len(lines) == len(expected), lines
        for line, start in zip(lines, expected, strict=True):
            assert line.startswith(start), lines
        assert lines[0].endswith(
            " of cluster dev is up: management https://127.0.0.215:8443, edge 127.0.0.215:7443"
        )
        assert first.stderr().splitlines() == [
            f"creating the dev cluster in {data_dir} (first start only)"
        ]
    finally:
        first.stop(signal.SIGTERM)
    assert '{"level"' not in first.stderr(), first.stderr()[-2000:]
    temporal = (logs / "temporal.log").read_text()
    assert "Nexus HTTP endpoints will not be available" in temporal
    assert all(line.startswith('{"level":') for line in temporal.splitlines())
    server = (logs / "server.log").read_text()
    assert " INFO pgserver: " in server
    assert " INFO oz0.temporal.host_keeper: Temporal serving on " in server
    assert " INFO oz0_common.commands: received SIGTERM, stopping" in server
    for log in (logs / "temporal.log", logs / "server.log"):
        assert log.stat().st_mode & 0o777 == 0o600

    verbose = dev_server(data_dir, tmp_path / "run2", "--verbose")
    try:
        verbose.start(ready="export OZ0_CONTEXT=")
        assert "password" not in "".join(verbose.stdout_lines)
    finally:
        verbose.stop(signal.SIGTERM)
    shown = verbose.stderr()
    assert " INFO pgserver: " in shown
    assert " WARNING oz0.temporal.host: {" in shown and "Nexus HTTP endpoints" in shown


@pytest.mark.slow
def test_a_context_learns_the_servers_and_outlives_the_first(
    cli: CliRunner, tmp_path: Path, pg_url: DatabaseUrl, start_server: StartServer
) -> None:
    files: ClusterFiles = initialise(tmp_path, pg_url, advertise=FIRST)
    env = files.cli_env
    assert Context.load(files.context_path).servers == (f"{FIRST}:8443",)
    first = start_server(files, FIRST)
    start_server(files, SECOND)

    info = cli("cluster", "info", "--json", env=env)
    assert info.code == 0, info.err
    learned = Context.load(files.context_path)
    assert learned.learned == (f"{FIRST}:8443", f"{SECOND}:8443")
    assert learned.servers == (f"{FIRST}:8443",)

    first.stop(signal.SIGTERM)
    listed = cli("node", "list", "--json", env=env)
    assert listed.code == 0, listed.err
    # The one that did not answer is dropped from the learned list at once.
    assert Context.load(files.context_path).learned == (f"{SECOND}:8443",)

    # Back again: the context learns it once its list is older than a minute.
    start_server(files, FIRST)
    assert cli("node", "list", env=env).code == 0
    assert Context.load(files.context_path).learned == (f"{SECOND}:8443",)
    later = pki.utcnow() + dt.timedelta(seconds=61)
    ApiClient(Context.load(files.context_path), now=lambda: later).get("/api/v1/nodes")
    assert Context.load(files.context_path).learned == (f"{FIRST}:8443", f"{SECOND}:8443")
