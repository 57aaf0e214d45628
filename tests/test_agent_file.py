"""The agent as one file (127.0.0.211 and .212): built once per session, served by a real
server, downloaded, and run with nothing but a stock python3 in a bare environment, where
it joins; all it unpacks stays in its data directory."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.cluster import REPO, ClusterFiles, StartServer
from fixtures.snapshots import snapshot
from oz0.server import join_command
from tests.conftest import CliRunner

pytestmark = pytest.mark.slow

SERVER, BARE_SERVER = "127.0.0.211", "127.0.0.212"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
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


def _bare_env(machine: Path, **extra: str) -> dict[str, str]:
    """What a fresh machine gives: a PATH without any virtual environment, an empty HOME."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(machine / "home"),
            "TMPDIR": str(machine / "tmp"), **extra}  # fmt: skip


def _machine(tmp_path: Path) -> Path:
    machine = tmp_path / "machine"
    for d in ("home", "tmp", "cwd"):
        (machine / d).mkdir(parents=True)
    return machine


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
    before = [snapshot(machine / d) for d in ("home", "tmp", "cwd")]
    done = subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in _bare_env(machine).items()),
         f"OZ0_NODE_DATA_DIR={data}", python, str(agent_file), "--help"],
        cwd=machine / "cwd", capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "start" in done.stdout and "status" in done.stdout
    assert [snapshot(machine / d) for d in ("home", "tmp", "cwd")] == before
    (unpacked,) = (data / "python").iterdir()
    assert (unpacked / "site-packages" / "oz0_node" / "main.py").is_file()


NOBODY = 65534


def test_the_bootstrap_unpacks_a_changed_layer_again_and_refuses_what_others_can_write(
    agent_file: Path, tmp_path: Path
) -> None:
    machine = _machine(tmp_path)
    data = machine / "node"

    def run_help() -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["env", "-i", *(f"{k}={v}" for k, v in _bare_env(machine).items()),
             f"OZ0_NODE_DATA_DIR={data}", STOCK_PYTHON, str(agent_file), "--help"],
            cwd=machine / "cwd", capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    assert run_help().returncode == 0
    (unpacked,) = (data / "python").iterdir()
    layer = unpacked / "site-packages"
    main = layer / "oz0_node" / "main.py"
    pristine = main.read_bytes()
    main.write_bytes(pristine + b'\nprint("CHANGED RAN")\n')
    again = run_help()
    assert again.returncode == 0 and "CHANGED RAN" not in again.stdout
    assert again.stderr == (
        f"oz0-node: {layer} holds oz0_node/main.py changed since it was unpacked; "
        "unpacking it again\n"
    )
    assert main.read_bytes() == pristine

    data.chmod(0o720)
    refused = run_help()
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"oz0-node: refusing to run: {data} is writable by group (mode 0720); chmod g-w it\n"
    )
    data.chmod(0o700)
    # A user ID no account has, not nobody: the pasted command's test watches nobody's files.
    os.chown(layer, 12345, 12345)
    refused = run_help()
    assert (refused.returncode, refused.stdout) == (1, "")
    assert refused.stderr == (
        f"oz0-node: refusing to run: {layer} is owned by uid 12345, not by root "
        "or the agent's user root (uid 0); chown it\n"
    )
    os.chown(layer, 0, 0)
    assert run_help().returncode == 0


def _owned_by_nobody(others: Path) -> dict[str, str]:
    """What user nobody has in the machine's temp directories, but for OTHERS (the pytest
    run's directories, where other tests' jobs run as nobody meanwhile and change their
    files between this test's looks): a file's SHA-256 or `dir`."""
    found = {}
    for top in ("/tmp", "/var/tmp", "/dev/shm"):
        for root, dirs, files in os.walk(top, onerror=lambda e: None):
            dirs[:] = [d for d in dirs if Path(root, d) != others]
            for name in dirs + files:
                path = Path(root, name)
                with contextlib.suppress(OSError):
                    if path.lstat().st_uid == NOBODY:
                        found[str(path)] = "dir" if path.is_dir() else _sha256(path)
    return found


def _nobody_processes(home: Path) -> list[int]:
    """Live processes of user nobody whose environment has HOME (the agent and its children)."""
    marker = f"HOME={home}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, IndexError):
            if not entry.name.isdigit() or entry.stat().st_uid != NOBODY:
                continue
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            if state != b"Z" and marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
    return found


def _in_any_argv(secret: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and secret.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


@pytest.fixture
def bare_machine() -> Iterator[Path]:
    """A machine's HOME and working directory for user nobody (the agent then takes the
    default data directory of a user that is not root, under HOME; as root it would be the
    machine's /var/lib/oz0-node), outside pytest's temp tree that nobody cannot enter."""
    machine = Path(tempfile.mkdtemp(prefix="oz0-bare-machine-"))  # HOME stays empty
    machine.chmod(0o755)
    for name in ("home", "work"):
        (machine / name).mkdir()
        os.chown(machine / name, NOBODY, NOBODY)
    try:
        yield machine
    finally:
        for pid in _nobody_processes(machine / "home"):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(machine, ignore_errors=True)


def test_the_printed_join_command_pasted_on_a_bare_machine_joins_and_a_purge_leaves_nothing(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    agent_file: Path,
    bare_machine: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OZ0_AGENT_FILE", str(agent_file))
    start_server(cluster_files, SERVER)
    env = cluster_files.cli_env
    # --json gives the same command as the text does, and the file's SHA-256 in it.
    created = cli("token", "create", "--tenant", "default", "--json", env=env)
    assert created.code == 0, created.err
    as_json = created.json()
    assert as_json["agent_sha256"] == _sha256(agent_file)
    assert as_json["join_command"] == join_command.render(
        as_json["token"], cluster_files.ca_hash, [SERVER], _sha256(agent_file)
    )
    created = cli("token", "create", "--tenant", "default", env=env)
    assert created.code == 0, created.err
    printed = created.out.rstrip("\n").splitlines()
    secret = printed[2].strip()
    # The command is the last line, alone, as a user copies it.
    assert printed[-2] == "" and secret in printed[-1] and f"{SERVER}:7443" in printed[-1]

    home, work = bare_machine / "home", bare_machine / "work"
    data = home / ".local" / "share" / "oz0-node"
    # Pasted where the user cannot write, next to a file named like the agent: neither
    # matters, the line works in a private directory of its own.
    os.chown(work, 0, 0)
    (work / "oz0-node").write_text("#!/bin/sh\necho impostor\n")
    (work / "oz0-node").chmod(0o755)
    others = tmp_path_factory.getbasetemp().parent  # every xdist worker's, this one's too
    tmp_before = _owned_by_nobody(others)
    before = {"home": snapshot(home), "work": snapshot(work), "tmp": tmp_before}
    log = tmp_path / "pasted.log"
    # Pasted: the shell reads the line from its input, as from a terminal (`sh -c LINE`
    # would put the token in the shell's arguments, which a paste does not).
    with log.open("w") as out:
        pasted = subprocess.Popen(
            ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
             "env", "-i", f"HOME={home}", "PATH=/usr/bin:/bin", "sh"],
            cwd=work, stdin=subprocess.PIPE, stdout=out, stderr=out, text=True,
        )  # fmt: skip
    assert pasted.stdin is not None
    pasted.stdin.write(printed[-1] + "\n")
    pasted.stdin.close()
    try:
        status: dict[str, object] = {}
        began = time.monotonic()
        while not (status.get("state") == "accepted" and status.get("connected") is True):
            assert pasted.poll() is None, log.read_text()
            assert time.monotonic() - began < 90, f"never connected: {status}\n{log.read_text()}"
            time.sleep(0.2)
            with contextlib.suppress(FileNotFoundError, ValueError):
                status = json.loads((data / "status.json").read_text())
        node_id = str(status["node_id"])
        shown = cli("node", "show", node_id, "--json", env=env)
        assert shown.json()["state"] == "accepted" and shown.json()["connected"] is True
        assert _in_any_argv(secret) == []
        (unpacked,) = (data / "python").iterdir()
        assert (unpacked / "site-packages" / "temporalio").is_dir()
        # The agent file is in a directory of nobody's own that the line made in /tmp.
        now = _owned_by_nobody(others)
        (made,) = [Path(p) for p in set(now) - set(tmp_before) if Path(p).parent == Path("/tmp")]
        assert made.stat().st_mode & 0o777 == 0o700
        assert (made / "oz0-node").read_bytes() == agent_file.read_bytes()

        assert cli("node", "purge", node_id, "--yes", env=env).code == 0
        assert pasted.wait(60) == 0, log.read_text()
    finally:
        if pasted.poll() is None:
            pasted.kill()
    assert _nobody_processes(home) == []
    after = {"home": snapshot(home), "work": snapshot(work), "tmp": _owned_by_nobody(others)}
    assert after == before, log.read_text()
    assert not data.exists() and (work / "oz0-node").read_text().endswith("impostor\n")


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
