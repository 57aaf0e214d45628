"""fixtures/zygotes.py: a process forked from a zygote runs `cli.main` (`oz0_node.main`) as
`python -m cli.main` would, with the caller's arguments, environment and working directory,
its stdout a pipe and its exit status told; what it cannot run the same is exec'd."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.cluster import REPO, cli_command
from fixtures.zygotes import AGENT, SERVER, ForkedProcess, Zygote


@pytest.fixture(scope="module")
def zygote() -> Iterator[Zygote]:
    started = Zygote(SERVER)
    try:
        yield started
    finally:
        started.close()


def _env(**changes: str) -> dict[str, str]:
    # None of this process's OZ0_* (an earlier test of the worker may have left
    # OZ0_CONTEXT, which the CLI reads before --context).
    env = {k: v for k, v in os.environ.items() if not k.startswith("OZ0_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(changes)
    return env


def _run(zygote: Zygote, tmp_path: Path, env: dict[str, str], *args: str) -> tuple[int, str, str]:
    stderr_path = tmp_path / "stderr"
    with stderr_path.open("w") as stderr:
        process = zygote.spawn(cli_command(*args), env, tmp_path, stderr)
    assert isinstance(process, ForkedProcess)
    assert process.stdout is not None
    with process.stdout:
        out = process.stdout.read()
    return process.wait(30), out, stderr_path.read_text()


def test_a_forked_cli_prints_to_its_own_stdout_and_exits_with_its_code(
    zygote: Zygote, tmp_path: Path
) -> None:
    code, out, err = _run(zygote, tmp_path, _env(), "--version")
    assert (code, out, err) == (0, "0.1.0\n", "")
    code, out, err = _run(zygote, tmp_path, _env(), "no-such-command")
    assert code == 2
    assert out == ""
    assert 'Unknown command "no-such-command"' in err


def test_a_forked_server_reads_the_callers_environment_and_directory(
    zygote: Zygote, tmp_path: Path
) -> None:
    start = ("server", "start", "--master-key-file", "key", "--advertise", "127.0.0.218")
    code, _, err = _run(zygote, tmp_path, _env(), *start)
    assert code == 1
    assert "OZ0_DB is not set" in err
    code, _, err = _run(zygote, tmp_path, _env(OZ0_DB="postgresql://u@127.0.0.1:1/x"), *start)
    assert code == 1
    # The relative path is read in the caller's directory, where it is missing.
    assert "master key file key not found" in err
    (tmp_path / "key").write_bytes(b"short")
    code, _, err = _run(zygote, tmp_path, _env(OZ0_DB="postgresql://u@127.0.0.1:1/x"), *start)
    assert code == 1
    assert "not found" not in err, err


def test_what_runs_other_code_or_another_interpreter_is_not_forked(zygote: Zygote) -> None:
    assert zygote.can_fork(cli_command("server", "start"), _env())
    assert not zygote.can_fork(["/usr/bin/python3", *cli_command()[1:]], _env())
    assert not zygote.can_fork(cli_command(), _env(PYTHONPATH="/elsewhere"))
    assert not zygote.can_fork(cli_command(), _env(PYTHONWARNINGS="error"))
    assert not zygote.can_fork([sys.executable, "-X", "importtime", "-m", "cli.main"], _env())


def test_a_signalled_forked_process_reports_the_signal(zygote: Zygote, tmp_path: Path) -> None:
    # A context file that is a FIFO nobody writes to: its open waits until the kill.
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with (tmp_path / "stderr").open("w") as stderr:
        process = zygote.spawn(
            cli_command("node", "list", "--context", str(fifo)), _env(), tmp_path, stderr
        )
    assert process.stdout is not None
    # Its pipe closed and the process ended however the test ends (else it waits on the
    # FIFO for ever, and a later test's GC warns of the pipe).
    with process.stdout, contextlib.ExitStack() as ending:
        ending.callback(process.kill)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(0.5)
        assert process.poll() is None, (tmp_path / "stderr").read_text()
        process.kill()
        assert process.wait(30) == -9


def test_an_agent_zygote_forks_agents_into_one_log_and_only_agents(tmp_path: Path) -> None:
    agents = Zygote(AGENT)
    try:
        agent = [sys.executable, "-m", "oz0_node.main"]
        assert agents.can_fork([*agent, "start"], _env())
        assert not agents.can_fork(cli_command("server", "start"), _env())
        assert not agents.can_fork(["ip", "netns", "exec", "n", *agent, "start"], _env())
        log_path = tmp_path / "agent.log"
        with log_path.open("a") as log:
            shown = agents.spawn([*agent, "--version"], _env(), tmp_path, log, stdout=log)
            failed = agents.spawn(
                [*agent, "status", "--data-dir", str(tmp_path / "none")], _env(), tmp_path, log,
                stdout=log,
            )  # fmt: skip
        assert shown.stdout is None
        assert (shown.wait(30), failed.wait(30)) == (0, 1)
        log_text = log_path.read_text()
        assert "0.1.0\n" in log_text
        assert f"error: {tmp_path / 'none'} holds no node identity" in log_text
    finally:
        agents.close()
