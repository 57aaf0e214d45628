"""The wheel `nox -s wheel` builds (127.0.0.54), on a machine without Go: installed in a
fresh virtual environment and run from outside the source tree, it starts a dev server
with the Temporal host it carries, serves the agent file it carries, and an agent joined
from that file runs a job."""

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
from packaging.tags import sys_tags
from packaging.utils import parse_wheel_filename

from fixtures.cluster import REPO, ServerProcess

pytestmark = pytest.mark.slow

ADDRESS = "127.0.0.54"
# `nox -s tests` builds the wheel before pytest starts and names it here (noxfile.py).
WHEEL_ENV = "OZ0_WHEEL"
STOCK_PYTHON = "/usr/bin/python3"
# What a machine without Go has on its PATH (Go lives in /usr/local/go/bin here and in CI):
# the system's directories of root's PATH (/etc/login.defs), /usr/local left out. With sbin:
# embedded PostgreSQL's first start as root runs `useradd` (a user of its own), which
# /usr/bin:/bin could not find where no earlier run had made that user.
BARE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
CARRIED = ("oz0/temporal/host/bin/oz0-temporal-host", "oz0/agent_file/bin/oz0-node")


def _built_here(out: Path) -> Path:
    """A wheel built as `nox -s wheel` builds it, but for auditwheel's tag (setuptools'
    own, linux_x86_64 here): pip, from a build directory of no earlier build (setuptools
    would add what it finds there)."""
    shutil.rmtree(REPO / "build", ignore_errors=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out),
         str(REPO)],
        check=True, timeout=1800,
    )  # fmt: skip
    (wheel,) = out.glob("*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get(WHEEL_ENV)
    if given:
        return Path(given)
    began = time.monotonic()
    built = _built_here(tmp_path_factory.mktemp("wheel"))
    print(f"wheel built in {time.monotonic() - began:.1f} s")
    return built


def _bare_path(machine: Path) -> str:
    """BARE_PATH, or where Go is in it (a distribution's package), a directory of links to
    all else it holds."""
    if shutil.which("go", path=BARE_PATH) is None:
        return BARE_PATH
    shadow = machine / "bin"
    shadow.mkdir(exist_ok=True)
    for directory in reversed(BARE_PATH.split(os.pathsep)):
        for tool in Path(directory).iterdir():
            if not tool.name.startswith("go"):
                (shadow / tool.name).unlink(missing_ok=True)
                (shadow / tool.name).symlink_to(tool)
    return str(shadow)


def _without_go(machine: Path, home: Path, venv: Path) -> dict[str, str]:
    """This process's environment without anything that would find the source tree, a
    virtual environment or Go: what a server machine gives (pip's own settings kept)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("OZ0_") and k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
    }
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{_bare_path(machine)}", HOME=str(home))
    assert shutil.which("go", path=env["PATH"]) is None
    return env


@pytest.fixture
def machine() -> Iterator[Path]:
    """Where the server machine's virtual environment and files go: outside pytest's temp
    tree, which the embedded PostgreSQL's own user (pgserver runs it as user pgserver when
    started as root) cannot enter."""
    top = Path(tempfile.mkdtemp(prefix="oz0-wheel-machine-"))
    top.chmod(0o755)
    try:
        yield top
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.fixture
def installed(wheel: Path, machine: Path) -> Path:
    """A fresh virtual environment with the wheel installed (no Go on pip's PATH)."""
    venv = machine / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    began = time.monotonic()
    # pip's cache is in this HOME: the dependencies come from it when they can.
    env = _without_go(machine, Path.home(), venv)
    subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-input", str(wheel)],
        check=True, timeout=900, env=env, cwd=machine,
    )  # fmt: skip
    print(f"wheel installed in {time.monotonic() - began:.1f} s")
    return venv


def test_the_wheel_is_for_this_platform_and_carries_the_host_and_the_agent_file(
    wheel: Path,
) -> None:
    # Any Python 3 (nothing in it is built against one), a platform this machine is.
    _, _, _, tags = parse_wheel_filename(wheel.name)
    assert {(t.interpreter, t.abi) for t in tags} == {("py3", "none")}, tags
    assert "any" not in {t.platform for t in tags} and tags & set(sys_tags()), tags
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (wheel_file,) = [n for n in names if n.endswith(".dist-info/WHEEL")]
        meta = archive.read(wheel_file).decode().splitlines()
        modes = {n: archive.getinfo(n).external_attr >> 16 for n in CARRIED if n in names}
    assert set(CARRIED) <= names, sorted(set(CARRIED) - names)
    assert "Root-Is-Purelib: false" in meta
    assert {line.removeprefix("Tag: ") for line in meta if line.startswith("Tag: ")} == {
        str(t) for t in tags
    }
    assert all(mode & 0o111 for mode in modes.values()), modes


@contextlib.contextmanager
def _running(args: list[str], env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[str]]:
    with log.open("w") as out:
        process = subprocess.Popen(
            args, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=out, text=True
        )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)


def test_installed_without_go_a_dev_server_starts_and_an_agent_from_it_runs_a_job(
    installed: Path, machine: Path
) -> None:
    for d in ("home", "tmp", "cwd"):
        (machine / d).mkdir(parents=True)
    env = _without_go(machine, machine / "home", installed)
    env.update(TMPDIR=str(machine / "tmp"))
    python = str(installed / "bin" / "python")
    where = subprocess.run(
        [python, "-c", "import oz0, oz0_node; print(oz0.__file__, oz0_node.__file__)"],
        env=env, cwd=machine / "cwd", capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert all(Path(p).is_relative_to(installed) for p in where.stdout.split()), where.stdout

    data_dir = machine / "dev"
    server = ServerProcess(
        args=[str(installed / "bin" / "orchestrator-zero"), "server", "start", "--dev",
              "--data-dir", str(data_dir), "--advertise", ADDRESS],
        env=env, cwd=machine / "cwd",
    )  # fmt: skip
    began = time.monotonic()
    try:
        server.start(timeout=180, ready="export OZ0_CONTEXT=")
        print(f"dev server up in {time.monotonic() - began:.1f} s")
        shown = dict(line.rstrip("\n").split(":", 1) for line in server.stdout_lines if ":" in line)
        ca_hash = shown["CA hash"].strip()
        context = server.stdout_lines[-1].rstrip("\n").split("=", 1)[1]
        cli_env = dict(env, OZ0_CONTEXT=context)

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [str(installed / "bin" / "orchestrator-zero"), *args],
                env=cli_env, cwd=machine / "cwd", capture_output=True, text=True, timeout=120,
            )  # fmt: skip

        created = cli("token", "create", "--tenant", "default", "--json")
        assert created.returncode == 0, created.stderr
        token = json.loads(created.stdout)
        # The agent file the server serves is the one the wheel carries.
        agent_file = machine / "oz0-node"
        subprocess.run(
            ["curl", "-ksSf", "-o", str(agent_file), f"https://{ADDRESS}:8443/agent/oz0-node"],
            check=True, timeout=60,
        )  # fmt: skip
        assert hashlib.sha256(agent_file.read_bytes()).hexdigest() == token["agent_sha256"]
        token_file = machine / "token"
        token_file.write_text(token["token"])
        token_file.chmod(0o600)

        node_data = machine / "node"
        agent_args = [STOCK_PYTHON, str(agent_file), "start", "--edge", f"{ADDRESS}:7443",
                      "--ca-hash", ca_hash, "--data-dir", str(node_data),
                      "--token-file", str(token_file)]  # fmt: skip
        agent_env = {"PATH": BARE_PATH, "HOME": str(machine / "home"),
                     "TMPDIR": str(machine / "tmp")}  # fmt: skip
        log = machine / "agent.log"
        with _running(agent_args, agent_env, log) as agent:
            status: dict[str, object] = {}
            joining = time.monotonic()
            while not (status.get("state") == "accepted" and status.get("connected") is True):
                assert agent.poll() is None, log.read_text()
                assert time.monotonic() - joining < 120, f"not joined: {status}\n{log.read_text()}"
                time.sleep(0.3)
                with contextlib.suppress(FileNotFoundError, ValueError):
                    status = json.loads((node_data / "status.json").read_text())
            print(f"agent joined in {time.monotonic() - joining:.1f} s")
            node = str(status["node_id"])
            ran = cli("job", "run", "--node", node, "--", "sh", "-c", "echo ran on $OZ0_NODE_ID")
            assert (ran.returncode, ran.stdout) == (0, f"ran on {node}\n"), (
                ran.stderr + log.read_text()
            )
            listed = json.loads(cli("job", "list", "--json").stdout)
            assert [(j["state"], j["exit_code"]) for j in listed] == [("succeeded", 0)]
    finally:
        server.kill()
    assert "Traceback" not in server.stderr(), server.stderr()[-3000:]
