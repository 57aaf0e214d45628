"""The join token reaches `oz0-node start` from a 0600 file or OZ0_JOIN_TOKEN, never from
its arguments: a real agent process joins a fake edge (127.0.0.1, port 0) with the token
while /proc/PID/cmdline never holds it; `--token` and a group-readable file are refused in
one line before anything is written."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import trio

from fixtures.fake_edges import GOOD_TOKEN, FakeCluster, serve_fake_edge
from oz0_common.files import write_private
from oz0_node import join_token
from oz0_node.errors import AgentError
from oz0_node.main import run

REPO = Path(__file__).resolve().parent.parent
CA_HASH = "sha256:" + "a" * 64


def _start_args(data: Path, *extra: str) -> list[str]:
    # No --edge: past the token, the agent stops at once ("give --edge") rather than
    # trying to reach an edge, so a token check that let something through fails fast.
    return ["start", "--ca-hash", CA_HASH, "--data-dir", str(data), *extra]


def _one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, lines
    return lines[0]


@pytest.fixture(autouse=True)
def _no_token_in_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(join_token.ENV_VAR, raising=False)


def test_a_private_token_file_is_read_and_stripped(tmp_path: Path) -> None:
    path = tmp_path / "token"
    write_private(path, b"tok-0123456789ab.secret\n")
    assert join_token.read(path, None) == "tok-0123456789ab.secret"


def test_the_token_comes_from_the_environment_and_leaves_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(join_token.ENV_VAR, " tok-0123456789ab.secret ")
    assert join_token.read(None, None) == "tok-0123456789ab.secret"
    assert join_token.ENV_VAR not in os.environ
    assert join_token.read(None, None) is None


def test_file_and_environment_together_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "token"
    write_private(path, b"tok-a.b")
    monkeypatch.setenv(join_token.ENV_VAR, "tok-c.d")
    with pytest.raises(AgentError, match="not both"):
        join_token.read(path, None)


@pytest.mark.parametrize("content", [b"", b"  \n", b"tok-a.b tok-c.d", b"\xff\xfe"])
def test_a_token_file_must_hold_one_token(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "token"
    write_private(path, content)
    with pytest.raises(AgentError, match="join token file"):
        join_token.read(path, None)


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644])
def test_a_token_file_open_to_group_or_others_is_refused_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], mode: int
) -> None:
    path = tmp_path / "token"
    write_private(path, GOOD_TOKEN.encode())
    path.chmod(mode)
    data = tmp_path / "node"
    assert run(_start_args(data, "--token-file", str(path))) == 1
    line = _one_error(capsys.readouterr().err)
    assert line == (
        f"error: join token file {path} is open to group or others (mode {mode:04o}); "
        f"run: chmod 600 {path}"
    )
    assert not data.exists()


def test_a_missing_token_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nope"
    assert run(_start_args(tmp_path / "node", "--token-file", str(path))) == 1
    assert _one_error(capsys.readouterr().err) == f"error: join token file {path} not found"


def test_token_on_the_command_line_is_refused_with_the_alternatives(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "node"
    assert run(_start_args(data, "--token", GOOD_TOKEN)) == 1
    line = _one_error(capsys.readouterr().err)
    assert line.startswith("error: --token would put the join token on the command line")
    assert "--token-file PATH" in line and join_token.ENV_VAR in line
    assert GOOD_TOKEN not in line
    assert not data.exists()


def _cmdline(pid: int) -> bytes:
    return Path(f"/proc/{pid}/cmdline").read_bytes()


async def _cmdline_once_started(pid: int) -> bytes:
    """The agent's command line once it runs: between fork and exec the child's is empty
    (or its parent's), a window a loaded machine widens."""
    for _ in range(250):
        cmdline = _cmdline(pid)
        if b"oz0_node.main" in cmdline:
            return cmdline
        await trio.sleep(0.02)
    return cmdline


@pytest.mark.parametrize("source", ["file", "env"])
async def test_a_real_agent_joins_with_the_token_that_is_never_in_its_cmdline(
    tmp_path: Path, nursery: trio.Nursery, source: str
) -> None:
    cluster = FakeCluster()
    address = await serve_fake_edge(cluster, nursery)
    data = tmp_path / "node"
    command = [
        sys.executable, "-m", "oz0_node.main", "start", "--edge", address,
        "--ca-hash", cluster.ca_hash, "--data-dir", str(data),
    ]  # fmt: skip
    env = dict(os.environ)
    if source == "file":
        token_file = tmp_path / "join-token"
        write_private(token_file, GOOD_TOKEN.encode() + b"\n")
        command += ["--token-file", str(token_file)]
    else:
        env[join_token.ENV_VAR] = GOOD_TOKEN
    log = tmp_path / "agent.log"
    with trio.fail_after(60), log.open("wb") as stderr:
        process = await trio.lowlevel.open_process(command, stderr=stderr, cwd=REPO, env=env)
        try:
            seen = [await _cmdline_once_started(process.pid)]
            await cluster.wait_for("welcome")
            seen.append(_cmdline(process.pid))
        finally:
            process.kill()
            await process.wait()
    (joined,) = cluster.of_kind("join")
    # The fake edge accepts GOOD_TOKEN into tenant acme: the token did reach the edge.
    assert joined.detail["token"] == GOOD_TOKEN, log.read_text()
    for cmdline in seen:
        assert b"oz0_node.main" in cmdline
        assert GOOD_TOKEN.encode() not in cmdline
    assert GOOD_TOKEN not in log.read_text()
