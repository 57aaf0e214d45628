"""The agent as one file: its size, start-up, cold start to connected and idle RSS (issue 12).

    python -m bench.agent_file [--file dist/oz0-node] [--runs 3] [--idle 30]

With a fresh test cluster and one real server on 127.0.0.212 (bench/runner.py starts them),
runs the file the way a fresh node does: `env -i PATH=/usr/bin:/bin HOME=<empty>`, the
stock /usr/bin/python3 through the file's `#!/usr/bin/env python3`. Measures `--help` with
an empty data directory (unpacking included) and again with it unpacked; `start` with a
token from launch to `status.json` saying accepted and connected, with an empty data
directory (cold: unpack, join, runtime; the --help runs had a data directory of their own)
and resuming (warm); then the agent's RSS after
--idle seconds connected, its runtime running. The same for `python -m oz0_node.main` from
this virtual environment as the baseline.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.runner import Bench, Scenario
from fixtures.cluster import REPO, cli_command
from oz0_common.addresses import EDGE_PORT

SERVER = "127.0.0.212"
CONNECT_BOUND = 120.0


def _bare(machine: Path, **extra: str) -> list[str]:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(machine / "home"), **extra}
    return ["env", "-i", *(f"{k}={v}" for k, v in env.items())]


def _dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def _timed_help(command: list[str]) -> float:
    began = time.monotonic()
    subprocess.run([*command, "--help"], check=True, capture_output=True, timeout=300)
    return round(time.monotonic() - began, 2)


def _until_connected(
    command: list[str], data: Path, log: Path
) -> tuple[subprocess.Popen[bytes], float]:
    began = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    while True:
        try:
            status = json.loads((data / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            status = {}
        if status.get("state") == "accepted" and status.get("connected") is True:
            return process, round(time.monotonic() - began, 2)
        if process.poll() is not None or time.monotonic() - began > CONNECT_BOUND:
            process.kill()
            raise RuntimeError(f"agent never connected:\n{log.read_text()}")
        time.sleep(0.05)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.send_signal(signal.SIGTERM)
    process.wait(30)


def _measure(
    name: str, program: list[str], env: dict[str, str], root: Path, join: list[str], token: str,
    args: Any,
) -> dict[str, Any]:  # fmt: skip
    result: dict[str, Any] = {"how": name}
    helps_cold, helps_warm, cold, warm = [], [], [], []
    for run in range(args.runs):
        machine = root / f"{name}-{run}"
        (machine / "home").mkdir(parents=True)
        data = machine / "node"
        log = machine / "agent.log"
        # Its own data directory: the start below finds nothing unpacked (cold).
        help_data = machine / "help-node"
        bare_help = [*_bare(machine, **env, OZ0_NODE_DATA_DIR=str(help_data)), *program]
        helps_cold.append(_timed_help(bare_help))
        helps_warm.append(_timed_help(bare_help))
        start = [*_bare(machine, **env, OZ0_JOIN_TOKEN=token), *program, "start", *join]
        process, took = _until_connected([*start, "--data-dir", str(data)], data, log)
        cold.append(took)
        _stop(process)
        (data / "status.json").unlink()
        resume = [*_bare(machine, **env), *program, "start", "--data-dir", str(data)]
        process, took = _until_connected(resume, data, log)
        warm.append(took)
        if run == args.runs - 1:
            time.sleep(args.idle)
            result["rss_idle_mib"] = round(_rss_mib(process.pid), 1)
            if (data / "python").exists():
                result["unpacked_mb"] = round(_dir_size(data / "python") / 1e6, 1)
        _stop(process)
    series = {
        "help_cold_s": helps_cold,
        "help_warm_s": helps_warm,
        "start_to_connected_cold_s": cold,
        "start_to_connected_warm_s": warm,
    }
    for key, values in series.items():
        result[key] = {"median": round(statistics.median(values), 2), "all": values}
    return result


NOBODY = 65534


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _pasted(join_command: str, args: Any) -> dict[str, Any]:
    """The join command `token create` prints, pasted as user nobody on a bare machine
    (download, check, unpack, join, runtime up), to accepted and connected; the agent's
    RSS after --idle seconds; then how long a start takes while pending (no token)."""
    took, rss = [], 0.0
    for run in range(args.runs):
        machine = Path(tempfile.mkdtemp(prefix="bench-pasted-"))
        try:
            machine.chmod(0o755)
            for name in ("home", "work"):
                (machine / name).mkdir()
                os.chown(machine / name, NOBODY, NOBODY)
            data = machine / "home" / ".local" / "share" / "oz0-node"
            paste = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
                     *_bare(machine), "sh"]  # fmt: skip
            began = time.monotonic()
            log = machine / "pasted.log"
            with log.open("ab") as out:
                # Read from the shell's input, as a paste is (no token in any argv).
                shell = subprocess.Popen(
                    paste, cwd=machine / "work", stdin=subprocess.PIPE, stdout=out, stderr=out
                )
            assert shell.stdin is not None
            shell.stdin.write(join_command.encode() + b"\n")
            shell.stdin.close()
            _wait_connected(shell, data, log, began)
            took.append(round(time.monotonic() - began, 2))
            if run == args.runs - 1:
                time.sleep(args.idle)
                # setpriv and env exec, so the shell has their pid; the agent is its child.
                (agent,) = _children(shell.pid)
                rss = round(_rss_mib(agent), 1)
            for pid in _children(shell.pid):
                os.kill(pid, signal.SIGTERM)
            shell.wait(30)
        finally:
            subprocess.run(["rm", "-rf", str(machine)], check=False)
    return {
        "pasted_to_connected_s": {"median": round(statistics.median(took), 2), "all": took},
        "rss_connected_mib": rss,
    }


def _wait_connected(process: subprocess.Popen[bytes], data: Path, log: Path, began: float) -> None:
    while True:
        try:
            status = json.loads((data / "status.json").read_text())
        except (FileNotFoundError, ValueError, PermissionError):
            status = {}
        if status.get("state") == "accepted" and status.get("connected") is True:
            return
        if process.poll() is not None or time.monotonic() - began > CONNECT_BOUND:
            process.kill()
            raise RuntimeError(f"agent never connected:\n{log.read_text()}")
        time.sleep(0.05)


def _pending_rss(program: list[str], root: Path, args: Any) -> float:
    """A node waiting for an operator (no token: pending, no runtime): its RSS after --idle s."""
    machine = root / "pending"
    (machine / "home").mkdir(parents=True)
    data = machine / "node"
    join = ["--edge", f"{SERVER}:{EDGE_PORT}", "--ca-hash", args.ca_hash, "--data-dir", str(data)]
    with (machine / "agent.log").open("ab") as out:
        process = subprocess.Popen(
            [*_bare(machine), *program, "start", *join],
            stdin=subprocess.DEVNULL, stdout=out, stderr=out,
        )  # fmt: skip
    began = time.monotonic()
    while True:
        try:
            status = json.loads((data / "status.json").read_text())
        except (FileNotFoundError, ValueError):
            status = {}
        if status.get("state") == "pending":
            break
        if process.poll() is not None or time.monotonic() - began > CONNECT_BOUND:
            process.kill()
            raise RuntimeError(f"never pending:\n{(machine / 'agent.log').read_text()}")
        time.sleep(0.05)
    time.sleep(args.idle)
    rss = round(_rss_mib(process.pid), 1)
    _stop(process)
    return rss


def use_the_file(bench: Bench) -> None:
    """The servers offer the file to the nodes (its path in their environment)."""
    agent_file = bench.args.file.absolute()
    bench.out["file"] = str(agent_file)
    bench.out["size_mb"] = round(agent_file.stat().st_size / 1e6, 1)
    os.environ["OZ0_AGENT_FILE"] = str(agent_file)


def measure(bench: Bench) -> None:
    args, files, root, report = bench.args, bench.files, bench.root, bench.out
    agent_file = args.file.absolute()
    create = cli_command("token", "create", "--tenant", "default", "--max-uses", "0")
    created = subprocess.run(
        [*create, "--json"],
        env={**os.environ, **files.cli_env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    token = json.loads(created.stdout)["token"]
    join = ["--edge", f"{SERVER}:{EDGE_PORT}", "--ca-hash", files.ca_hash]
    venv = [sys.executable, "-m", "oz0_node.main"]
    report["runs"] = [
        _measure("file", [str(agent_file)], {}, root, join, token, args),
        _measure("venv", venv, {"PYTHONPATH": str(REPO)}, root, join, token, args),
    ]
    report["pasted"] = _pasted(json.loads(created.stdout)["join_command"], args)
    args.ca_hash = files.ca_hash
    report["file_pending_rss_mib"] = _pending_rss([str(agent_file)], root, args)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, default=REPO / "dist" / "oz0-node")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle", type=float, default=30.0)


SCENARIO = Scenario(
    "agent_file",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda _: (SERVER,),
    before_servers=use_the_file,
    measured=("oz0", "cli", "oz0_node"),
)
