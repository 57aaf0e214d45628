"""`oz0-node` as a user runs it: status output, one-line errors, and a real process
joining a fake edge over real TCP on 127.0.0.1 (port 0), stopped by SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio

from fixtures.fake_edges import GOOD_TOKEN, FakeCluster, serve_fake_edge
from oz0_common.files import write_private
from oz0_node import status
from oz0_node.identity import IdentityDir, NodeRecord
from oz0_node.main import run

REPO = Path(__file__).resolve().parent.parent
STATUS_KEYS = {"node_id", "cluster", "state", "connected", "server"}


def _node_dir(tmp_path: Path) -> Path:
    identity = IdentityDir(tmp_path / "node")
    identity.create()
    identity.save_record(
        NodeRecord(
            cluster="prod",
            ca_hash="sha256:" + "a" * 64,
            node_id="node-0123456789ab",
            state="accepted",
            edges=["edge-a:7443"],
        )
    )
    return identity.data_dir


def _write_status(data: Path, *, pid: int, connected: bool) -> None:
    (data / "status.json").write_text(
        json.dumps(
            {
                "node_id": "node-0123456789ab",
                "cluster": "prod",
                "state": "accepted",
                "connected": connected,
                "server": "server-1" if connected else None,
                "pid": pid,
                "updated_at": "2025-01-01T00:00:00+00:00",
            }
        )
    )


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_status_json_of_a_running_connected_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _node_dir(tmp_path)
    _write_status(data, pid=os.getpid(), connected=True)
    with IdentityDir(data).locked():
        assert run(["status", "--data-dir", str(data), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) >= STATUS_KEYS
    assert shown["node_id"] == "node-0123456789ab"
    assert shown["cluster"] == "prod"
    assert shown["state"] == "accepted"
    assert shown["connected"] is True
    assert shown["server"] == "server-1"


def test_status_of_an_agent_that_died_is_not_connected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _node_dir(tmp_path)
    _write_status(data, pid=_dead_pid(), connected=True)
    assert run(["status", "--data-dir", str(data), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["connected"], shown["server"]) == (False, None)
    assert shown["state"] == "accepted"


def test_status_of_a_live_pid_without_the_agent_lock_is_not_connected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _node_dir(tmp_path)
    _write_status(data, pid=os.getpid(), connected=True)
    (data / "agent.lock").touch()
    assert run(["status", "--data-dir", str(data), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["connected"], shown["server"]) == (False, None)


def test_status_before_the_agent_ever_ran_reads_node_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _node_dir(tmp_path)
    assert run(["status", "--data-dir", str(data)]) == 0
    out = capsys.readouterr().out
    assert "node-0123456789ab" in out
    assert "connected: no (agent not running)" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["status"], "holds no node identity"),
        (["start"], "holds no node identity; to join a cluster, give --edge and --ca-hash"),
        (["start", "--edge", "a:1", "--ca-hash", "md5:00"], "--ca-hash must be sha256:"),
        (["start", "--edge", "a:99999", "--ca-hash", "sha256:" + "0" * 64], "--edge:"),
        (
            ["start", "--edge", "a:1", "--ca-hash", "sha256:" + "0" * 64, "--label", "novalue"],
            "--label must be KEY=VALUE",
        ),
        (
            ["start", "--edge", "a:1", "--ca-hash", "sha256:" + "0" * 64, "--max-jobs", "0"],
            "--max-jobs must be a whole number from 1 to 256, not 0",
        ),
        (
            ["start", "--max-jobs", "257"],
            "--max-jobs must be a whole number from 1 to 256, not 257",
        ),
    ],
)
def test_failures_are_one_line_on_stderr(
    args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "node"
    code = run([*args, "--data-dir", str(data)])
    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert len(err.splitlines()) == 1
    assert err.startswith("error: ")
    assert message in err
    assert not data.exists()


def test_a_changed_ca_hash_is_refused_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = _node_dir(tmp_path)
    code = run(["start", "--data-dir", str(data), "--ca-hash", "sha256:" + "b" * 64])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines()[-1] == (
        f"error: {data} belongs to cluster prod (CA sha256:{'a' * 64}), "
        f"not to --ca-hash sha256:{'b' * 64}"
    )


# --- a real process over real TCP ------------------------------------------------------


def _agent_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "oz0_node.main", *args]


async def _status_json(data: Path) -> dict[str, object]:
    done = await trio.run_process(
        _agent_command("status", "--data-dir", str(data), "--json"), capture_stdout=True, cwd=REPO
    )
    shown = json.loads(done.stdout)
    assert isinstance(shown, dict)
    return shown


async def _until_connected(data: Path) -> None:
    """Poll: the agent is another process, and its status file is all it tells."""
    while True:
        if (data / "status.json").exists() and status.read(data)["connected"]:
            return
        await trio.sleep(0.05)


async def test_the_agent_process_joins_reports_status_and_stops_on_sigterm(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    cluster = FakeCluster()
    address = await serve_fake_edge(cluster, nursery)
    data = tmp_path / "node"
    log = tmp_path / "agent.log"
    token_file = tmp_path / "join-token"
    write_private(token_file, GOOD_TOKEN.encode())
    command = _agent_command(
        "start", "--edge", address, "--ca-hash", cluster.ca_hash, "--token-file",
        str(token_file), "--label", "team=data", "--data-dir", str(data),
    )  # fmt: skip
    with trio.fail_after(60), log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(command, stderr=stderr, cwd=REPO)
        try:
            await cluster.wait_for("welcome")
            await _until_connected(data)
            shown = await _status_json(data)
            assert set(shown) >= STATUS_KEYS
            (node_id,) = cluster.nodes
            assert shown["node_id"] == node_id
            assert (shown["cluster"], shown["state"]) == ("test", "accepted")
            assert (shown["connected"], shown["server"]) == (True, "server-127.0.0.1")
            process.send_signal(signal.SIGTERM)
            with trio.fail_after(5):
                code = await process.wait()
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert code == 0, log.read_text()
    assert json.loads((data / "status.json").read_text())["connected"] is False
    assert (await _status_json(data))["connected"] is False
    assert cluster.of_kind("join")[0].detail["labels"] == {"team": "data"}


async def test_the_agent_process_refuses_a_wrong_ca_hash_in_one_line(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    cluster = FakeCluster()
    address = await serve_fake_edge(cluster, nursery)
    wrong = "sha256:" + "0" * 64
    command = _agent_command(
        "start", "--edge", address, "--ca-hash", wrong, "--data-dir", str(tmp_path / "node")
    )
    with trio.fail_after(30):
        done = await trio.run_process(command, capture_stderr=True, check=False, cwd=REPO)
    assert done.returncode == 1
    errors = [line for line in done.stderr.decode().splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: CA hash mismatch: edge {address} presented {cluster.ca_hash}, expected {wrong}"
    ]
    assert cluster.of_kind("join") == []
