"""A node's plugins and its purge, with a real agent and a real server (127.0.0.213).

The agent runs the way a machine runs it: its own launcher file (`oz0-node`, in the working
directory), its own HOME and temp directory, the join token in the environment and the
data directory under HOME (OZ0_NODE_DATA_DIR: these tests run as root, whose default is
the machine's /var/lib/oz0-node). Its plugin runs while its runtime runs and stops at a
block and at SIGTERM; a purge leaves HOME, the working directory and the temp directory as
they were before the join, minus the launcher, and no process of the node behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fixtures.cluster import REPO, ClusterFiles, StartServer, alive
from fixtures.polling import wait_until
from fixtures.snapshots import snapshot
from tests.conftest import CliRunner

SERVER = "127.0.0.213"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
# Generous: a loaded machine, a Temporal worker to start.
BOUND = 45.0

PLUGIN = """#!/bin/sh
sleep 1000 &
echo "started $$ child $!"
trap 'echo "got TERM $$"; kill $!; exit 0' TERM
while :; do sleep 0.1; done
"""


@dataclass
class Machine:
    """A machine's HOME, working directory and temp directory, and the agent's launcher."""

    home: Path
    work: Path
    tmp: Path
    launcher: Path
    log: Path

    @property
    def data_dir(self) -> Path:
        return self.home / ".local" / "share" / "oz0-node"

    def snapshots(self) -> dict[str, dict[str, str]]:
        return {name: snapshot(root) for name, root in self.roots().items()}

    def roots(self) -> dict[str, Path]:
        return {"home": self.home, "work": self.work, "tmp": self.tmp}

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "HOME": str(self.home),
            "TMPDIR": str(self.tmp),
            "PYTHONPATH": str(REPO),
            "PYTHONDONTWRITEBYTECODE": "1",
            "OZ0_NODE_DATA_DIR": str(self.data_dir),
            **extra,
        }

    def start(self, *args: str, **env: str) -> subprocess.Popen[str]:
        with self.log.open("a") as log:
            return subprocess.Popen(
                [str(self.launcher), "start", *args],
                cwd=self.work,
                env=self.env(**env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                text=True,
            )

    def reported(self) -> dict[str, Any]:
        try:
            value: dict[str, Any] = json.loads((self.data_dir / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            return {}
        return value

    def wait_reported(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        deadline = time.monotonic() + BOUND
        while not predicate(reported := self.reported()):
            assert time.monotonic() < deadline, f"{reported}\n{self.log.read_text()}"
            time.sleep(0.1)
        return reported


@pytest.fixture
def machine(tmp_path: Path) -> Iterator[Machine]:
    root = tmp_path / "machine"
    home, work, tmp = root / "home", root / "work", root / "tmp"
    for directory in (home, work, tmp):
        directory.mkdir(parents=True)
    (home / ".profile").write_text("# the user's own\n")
    launcher = work / "oz0-node"
    # Named oz0-node, so the agent takes it for its launcher without being told.
    launcher.write_text(f"#!{sys.executable}\nfrom oz0_node.main import main\nmain()\n")
    launcher.chmod(0o755)
    found = Machine(home, work, tmp, launcher, tmp_path / "agent.log")
    yield found
    for pid in node_processes(found.data_dir):
        os.kill(pid, signal.SIGKILL)


def node_processes(data_dir: Path) -> list[int]:
    """Live processes the node started, or the agent itself: their environment names
    DATA_DIR (the agent's through OZ0_NODE_DATA_DIR, its plugins' and jobs' after it)."""
    marker = f"OZ0_NODE_DATA_DIR={data_dir}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z" and marker in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def connected_and_running(status: dict[str, Any]) -> bool:
    return status.get("connected") is True and status.get("runtime") == "running"


def plugin_runs(machine: Machine) -> list[str]:
    path = machine.data_dir / "logs" / "plugin-probe.log"
    text = path.read_text() if path.exists() else ""
    return [line for line in text.splitlines() if line.startswith("started ")]


def wait_plugin_runs(machine: Machine, count: int, what: str) -> None:
    wait_until(
        lambda: len(plugin_runs(machine)) == count,
        BOUND,
        what,
        step=0.1,
        detail=machine.log.read_text,
    )


def pids_of(run: str) -> list[int]:
    _, pid, _, child = run.split()
    return [int(pid), int(child)]


@pytest.mark.slow
def test_plugins_follow_the_runtime_and_a_purge_leaves_the_machine_as_it_was(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    cluster_env: dict[str, str],
    start_server: StartServer,
    machine: Machine,
) -> None:
    start_server(cluster_files, SERVER)
    created = cli("token", "create", "--tenant", "default", "--json", env=cluster_env)
    assert created.code == 0, created.err
    before = machine.snapshots()

    agent = machine.start(
        "--edge", EDGE, "--ca-hash", cluster_files.ca_hash, OZ0_JOIN_TOKEN=created.json()["token"]
    )
    node_id = machine.wait_reported(connected_and_running)["node_id"]
    plugin = machine.data_dir / "plugins" / "probe"
    plugin.parent.mkdir()
    plugin.write_text(PLUGIN)
    plugin.chmod(0o755)

    # Plugins start with the runtime: a block and an unblock make it start again.
    assert cli("node", "block", node_id, "--reason", "test", env=cluster_env).code == 0
    machine.wait_reported(lambda s: s.get("state") == "blocked")
    assert plugin_runs(machine) == []
    assert cli("node", "unblock", node_id, env=cluster_env).code == 0
    machine.wait_reported(connected_and_running)
    wait_plugin_runs(machine, 1, "the plugin started")
    first = pids_of(plugin_runs(machine)[0])
    assert all(alive(pid) for pid in first)

    # A block stops it (SIGTERM: it says so), an unblock starts it again.
    assert cli("node", "block", node_id, "--reason", "test", env=cluster_env).code == 0
    wait_until(
        lambda: not any(alive(pid) for pid in first),
        BOUND,
        "the plugin stopped",
        step=0.1,
        detail=machine.log.read_text,
    )
    log = (machine.data_dir / "logs" / "plugin-probe.log").read_text()
    assert f"got TERM {first[0]}" in log
    assert cli("node", "unblock", node_id, env=cluster_env).code == 0
    wait_plugin_runs(machine, 2, "the plugin started again")

    # SIGTERM to the agent stops it and its plugin; a start resumes both.
    second = pids_of(plugin_runs(machine)[1])
    agent.send_signal(signal.SIGTERM)
    assert agent.wait(BOUND) == 0
    assert not any(alive(pid) for pid in second)
    assert node_processes(machine.data_dir) == []
    agent = machine.start()
    wait_plugin_runs(machine, 3, "the plugin started on resume")
    third = pids_of(plugin_runs(machine)[2])

    # The purge: everything stopped, the data directory and the launcher gone, no more.
    assert cli("node", "purge", node_id, "--yes", env=cluster_env).code == 0
    assert agent.wait(BOUND) == 0, machine.log.read_text()
    assert not any(alive(pid) for pid in third)
    assert node_processes(machine.data_dir) == []
    assert not machine.data_dir.exists() and not machine.launcher.exists()
    after = machine.snapshots()
    expected = {**before, "work": {k: v for k, v in before["work"].items() if k != "oz0-node"}}
    assert after == expected, machine.log.read_text()
    assert f"node {node_id} purged: deleted {machine.data_dir} and {machine.launcher}" in (
        machine.log.read_text()
    )
