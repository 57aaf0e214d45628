from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.main import run
from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import ClusterFiles, ServerProcess, initialise, kill_all
from fixtures.postgres import fresh_database_url
from oz0.store.dburl import DatabaseUrl


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        return json.loads(self.out)


CliRunner = Callable[..., CliResult]

# Each test file keeps to loopback addresses of its own (README), so `nox -s tests` runs
# files side by side on two workers (`-n 2`); the files that share 127.0.0.11-.18 (the
# default cluster's address among them) are one scope, run one test at a time.
_SHARED_ADDRESSES = re.compile(r"127\.0\.0\.1[1-8]\b")
SHARED_SCOPE = "addresses 127.0.0.11-.18"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    from xdist.scheduler import LoadScopeScheduling

    shares: dict[str, bool] = {}

    class ByAddresses(LoadScopeScheduling):  # type: ignore[misc]
        """One scope a test file, or one for all the files sharing addresses."""

        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            if file not in shares:
                text = (config.rootpath / file).read_text(encoding="utf-8")
                shares[file] = _SHARED_ADDRESSES.search(text) is not None
            return SHARED_SCOPE if shares[file] else file

    return ByAddresses(config, log)


@pytest.fixture
def pg_url() -> Iterator[DatabaseUrl]:
    with fresh_database_url() as url:
        yield url


@pytest.fixture
def cluster_files(tmp_path: Path, pg_url: DatabaseUrl) -> ClusterFiles:
    return initialise(tmp_path, pg_url)


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> CliRunner:
    """Run `orchestrator-zero ARGS` in this process with ENV set; capture its output."""

    def invoke(*args: str, env: dict[str, str] | None = None) -> CliResult:
        with monkeypatch.context() as m:
            m.delenv("OZ0_CONTEXT", raising=False)
            m.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
            for key, value in (env or {}).items():
                m.setenv(key, value)
            capsys.readouterr()
            code = run(list(args))
            out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return invoke


@pytest.fixture
def cluster_env(cluster_files: ClusterFiles) -> dict[str, str]:
    return cluster_files.cli_env


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator[Callable[..., ServerProcess]]:
    started: list[ServerProcess] = []

    def start(files: ClusterFiles, address: str, *extra: str) -> ServerProcess:
        server = ServerProcess.for_cluster(
            files, address, workdir=tmp_path / f"server-{address}", extra=extra
        )
        started.append(server)
        return server.start()

    yield start
    kill_all(started)


@pytest.fixture
def agents() -> Iterator[list[AgentProcess]]:
    """Real agents a test starts (append them); stopped at its end."""
    started: list[AgentProcess] = []
    yield started
    stop_all(started)
