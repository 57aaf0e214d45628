"""The agent as one file (127.0.0.211 and .212): built once per session, served by a real
server, downloaded, and run with nothing but a stock python3 in a bare environment, where
it joins; all it unpacks stays in its data directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from fixtures.cluster import REPO, ClusterFiles, ServerProcess, initialise
from oz0.store.dburl import DatabaseUrl
from tests.conftest import CliRunner

pytestmark = pytest.mark.slow

StartServer = Callable[..., ServerProcess]
SERVER, BARE_SERVER = "127.0.0.211", "127.0.0.212"
STOCK_PYTHON = "/usr/bin/python3"
SERVER_ONLY = ("psycopg", "psycopg_binary", "psycopg_pool", "pgserver", "quart", "quart_trio",
               "hypercorn", "jinja2", "oz0", "cli")  # fmt: skip


@pytest.fixture(scope="session")
def agent_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """$OZ0_AGENT_FILE (`nox -s tests` sets the one installing built), else a build of our own."""
    given = os.environ.get("OZ0_AGENT_FILE")
    if given:
        return Path(given)
    out = tmp_path_factory.mktemp("agent-file") / "oz0-node"
    subprocess.run(
        [sys.executable, str(REPO / "oz0" / "agent_file" / "build.py"), "--out", str(out)],
        check=True,
        timeout=900,
    )
    return out


@pytest.fixture
def cluster_files(tmp_path: Path, pg_url: DatabaseUrl) -> ClusterFiles:
    return initialise(tmp_path, pg_url, advertise=SERVER)


def _bare_env(machine: Path, **extra: str) -> dict[str, str]:
    """What a fresh machine gives: a PATH without any virtual environment, an empty HOME."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(machine / "home"),
            "TMPDIR": str(machine / "tmp"), **extra}  # fmt: skip


def _machine(tmp_path: Path) -> Path:
    machine = tmp_path / "machine"
    for d in ("home", "tmp", "cwd"):
        (machine / d).mkdir(parents=True)
    return machine


def _snapshot(*roots: Path) -> dict[str, list[str]]:
    return {str(r): sorted(str(p.relative_to(r)) for p in r.rglob("*")) for r in roots}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_file_carries_the_agent_and_nothing_of_the_server(agent_file: Path) -> None:
    assert agent_file.read_bytes().startswith(b"#!/usr/bin/env python3\n")
    assert os.access(agent_file, os.X_OK)
    with zipfile.ZipFile(agent_file) as archive:
        names = archive.namelist()
        manifest = json.loads(archive.read("bundle.json"))
    tops = {n.split("/")[1] for n in names if n.count("/") >= 2}
    assert {"oz0_node", "oz0_common", "trio", "temporalio", "cryptography"} <= tops
    assert tops.isdisjoint(SERVER_ONLY), sorted(tops & set(SERVER_ONLY))
    # cffi is built for one Python version: one copy for each supported version.
    assert {"cp311", "cp312", "cp313"} <= set(manifest["pythons"])
    for tag in manifest["layers"]:
        assert any(n.startswith(f"{tag}/_cffi_backend") for n in names), tag
    sha_file = agent_file.parent / "oz0-node.sha256"
    assert sha_file.read_text() == f"{_sha256(agent_file)}  oz0-node\n"


def _pythons() -> list[str]:
    """Every CPython 3.11 or newer on this machine, the stock one first."""
    pyenv = sorted(Path("/root/.pyenv/versions").glob("3.1[1-9]*/bin/python3"))
    return [p for p in [STOCK_PYTHON, *map(str, pyenv)] if Path(p).exists()]


@pytest.mark.parametrize("python", _pythons())
def test_help_runs_with_a_bare_python(agent_file: Path, tmp_path: Path, python: str) -> None:
    machine = _machine(tmp_path)
    data = machine / "node"
    before = _snapshot(machine / "home", machine / "tmp", machine / "cwd")
    done = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in _bare_env(machine).items()),
         f"OZ0_NODE_DATA_DIR={data}", python, str(agent_file), "--help"],
        cwd=machine / "cwd", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "start" in done.stdout and "status" in done.stdout
    assert _snapshot(machine / "home", machine / "tmp", machine / "cwd") == before
    (unpacked,) = (data / "python").iterdir()
    assert (unpacked / "site-packages" / "oz0_node" / "main.py").is_file()


def test_a_downloaded_file_joins_from_a_bare_machine(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    agent_file: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OZ0_AGENT_FILE", str(agent_file))
    start_server(cluster_files, SERVER)
    machine = _machine(tmp_path)
    downloaded = machine / "bin" / "oz0-node"
    downloaded.parent.mkdir()
    base = f"https://{SERVER}:8443/agent/oz0-node"
    # No sign-in: curl has no client certificate.
    subprocess.run(["curl", "-ksSf", "-o", str(downloaded), base], check=True, timeout=60)
    served_sha = subprocess.run(
        ["curl", "-ksSf", f"{base}.sha256"], check=True, timeout=60, capture_output=True, text=True
    ).stdout
    assert served_sha == f"{_sha256(agent_file)}  oz0-node\n"
    assert _sha256(downloaded) == _sha256(agent_file)
    downloaded.chmod(0o755)

    created = cli("token", "create", "--tenant", "default", "--json", env=cluster_files.cli_env)
    assert created.code == 0, created.err
    data = machine / "node"
    roots = (machine / "home", machine / "tmp", machine / "cwd", machine / "bin")
    before = _snapshot(*roots)
    env = _bare_env(machine, OZ0_JOIN_TOKEN=created.json()["token"])
    log = tmp_path / "agent.log"
    began = time.monotonic()
    with log.open("w") as out:
        agent = subprocess.Popen(
            ["env", "-i", *(f"{k}={v}" for k, v in env.items()), str(downloaded), "start",
             "--edge", f"{SERVER}:7443", "--ca-hash", cluster_files.ca_hash,
             "--data-dir", str(data)],
            cwd=machine / "cwd", stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    try:
        status: dict[str, object] = {}
        while not (status.get("state") == "accepted" and status.get("connected") is True):
            assert agent.poll() is None, log.read_text()
            assert time.monotonic() - began < 90, f"never connected: {status}\n{log.read_text()}"
            time.sleep(0.2)
            with contextlib.suppress(FileNotFoundError, ValueError):
                status = json.loads((data / "status.json").read_text())
        shown = cli("node", "show", str(status["node_id"]), "--json", env=cluster_files.cli_env)
        assert shown.json()["connected"] is True
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(30)
    assert _snapshot(*roots) == before, log.read_text()
    assert {p.name for p in data.iterdir()} >= {"identity", "python"}
    (unpacked,) = (data / "python").iterdir()
    assert (unpacked / "site-packages" / "temporalio").is_dir()


def test_a_server_without_the_file_answers_404_and_warns(
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    missing = tmp_path / "no-such-agent"
    monkeypatch.setenv("OZ0_AGENT_FILE", str(missing))
    server = start_server(cluster_files, BARE_SERVER)
    for path in ("oz0-node", "oz0-node.sha256"):
        done = subprocess.run(
            ["curl", "-ksS", "-w", "\n%{http_code}", f"https://{BARE_SERVER}:8443/agent/{path}"],
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        body, code = done.stdout.rsplit("\n", 1)
        assert code == "404"
        assert json.loads(body)["error"].startswith(f"the agent file {missing} is not built; run")
    warnings = [line for line in server.stderr().splitlines() if "the agent file" in line]
    assert len(warnings) == 1 and "WARNING" in warnings[0], server.stderr()
