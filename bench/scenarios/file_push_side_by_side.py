"""`file push` side by side with SaltStack 3008's `salt-cp` on this machine (issue 43).

    python -m bench.file_push_side_by_side [--nodes 20] [--rounds R] [--size-mib 10]
                                           [--servers S] [--systems NAME...]
                                           [--command-timeout S] [--salt-venv DIR]
                                           [--results-dir DIR] [--server-logs DIR]

The fleets are bench.salt_side_by_side's (its SideBySide grows them; bench/salt.py):
minions node-1..N of one salt-master on 127.0.0.37, and N real agents over S real servers
(default 3) on 127.0.0.34-.36, agent i given edge i % S first; each grows to each size of
--nodes in turn (ascending).

Each round makes a new file of --size-mib MiB (random bytes written as base64 text, so
that `salt-cp`'s default mode, which reads its file as text, can carry it; new content
each round, so no push finds it stored or on the nodes already) and sends it to every
node, one system after the other (who goes first alternates):

- `salt-cp '*' FILE NAME`: Salt's default, the whole file in one publish (`cp.recv`);
- `salt-cp --chunked '*' FILE NAME`: in publishes of `salt_cp_chunk_size` (96 KiB);
- `orchestrator-zero file push FILE --dest NAME --all --json`: uploaded to the cluster
  (only what it lacks, here all of it), then a job whose part each agent runs itself,
  fetching the blob over its control stream.

NAME is relative: each minion runs in its own directory (bench/salt.py) and writes there,
each agent in its DATA_DIR/files. After each command every copy is read back and its
SHA-256 compared with the file's: a copy missing or different (or an answer that is not
success from every node) ends the run, exit 1, and nothing of it counts. The copies are
then removed. Each figure is the command's wall time, as an operator sees it (its CLI's
start-up included; what counts), beside when the last copy was written (its mtime, from
the command's start: Salt's minions write the file well before salt-cp has their
answers, each of which carries the whole file back to the master in its `fun_args`),
with the CPU-seconds of each side's control plane (the master; our servers, their
Temporal hosts and PostgreSQL) and nodes (minions; agents) over it; summarised as p50
and worst over the rounds, and `file push`'s p50 as a share of each
salt-cp's. The JSON document goes to stdout and to --results-dir.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import trio

from bench import runner
from bench.runner import Scenario, create_token, log, wait_until_servers
from bench.salt import DEFAULT_VENV, SaltFleet
from bench.scenarios.salt_side_by_side import (
    OURS,
    RESULTS_DIR,
    Failed,
    SideBySide,
    before_servers,
    step,
    timed,
    write_results,
)
from fixtures.agent import stop_all

MASTER = "127.0.0.37"
SERVER_ADDRESSES = ("127.0.0.34", "127.0.0.35", "127.0.0.36")
# Each command is killed (and the run fails) past --command-timeout (salt-cp's own -t is
# that too): salt-cp of 10 MiB took 13 minutes at 20 minions (each minion's return
# carries the file back to the master, whose requests time out and are sent again).
COMMAND_TIMEOUT = 3600.0
SYSTEMS = ("salt-cp", "salt-cp --chunked", "file push")
# --systems names them without spaces.
SYSTEM_NAMES = {
    "salt-cp": "salt-cp",
    "salt-cp-chunked": "salt-cp --chunked",
    "file-push": "file push",
}
SALT_CHUNKED = "salt-cp --chunked"
OURS_NAME = "file push"


def make_file(directory: Path, name: str, size: int) -> tuple[Path, str]:
    """SIZE bytes of base64 text of random bytes at DIRECTORY/NAME: the path, its SHA-256."""
    raw = os.urandom(size * 3 // 4 + 3)
    data = base64.b64encode(raw)[:size]
    path = directory / name
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


def sha256_of(path: Path) -> str | None:
    try:
        with path.open("rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def last_written(copies: dict[str, Path]) -> float:
    """When the last of COPIES was last written (its mtime), on the epoch's clock."""
    return max(path.stat().st_mtime for path in copies.values())


def check_copies(copies: dict[str, Path], sha256: str) -> list[str]:
    """What is wrong with COPIES (node: path), each to hold content SHA256; [] if none."""
    wrong = []
    for node, path in copies.items():
        got = sha256_of(path)
        if got != sha256:
            wrong.append(f"{node}: {path} {'missing' if got is None else 'has SHA-256 ' + got}")
    return wrong


class FilePush:
    """The run: SIDE's fleets, one file a round to all of them in each system."""

    def __init__(self, side: SideBySide, work: Path) -> None:
        self.side = side
        self.work = work
        self.sizes: dict[str, Any] = {}

    @property
    def args(self) -> argparse.Namespace:
        return self.side.args

    def copies(self, system: str, name: str) -> dict[str, Path]:
        if system == OURS_NAME:
            return {
                f"agent {i + 1}": agent.data_dir / "files" / name
                for i, agent in enumerate(self.side.agents)
            }
        salt = self.side.salt
        return {
            f"node-{i + 1}": salt.root / f"node-{i + 1}" / name for i in range(len(salt.minions))
        }

    def send(self, system: str, source: Path, name: str) -> tuple[float, str | None]:
        """SYSTEM's command sending SOURCE to every node as NAME: its wall time, and what
        went wrong by its own account (None: it says every node has it)."""
        nodes = len(self.side.agents)
        if system == OURS_NAME:
            command = [OURS, "file", "push", str(source), "--dest", name, "--all", "--json"]
            ran = timed(command, self.side.env, self.args.command_timeout)
            if ran.code != 0:
                return ran.wall, ran.problem("file push did not succeed")
            try:
                pushes = json.loads(ran.stdout)["pushes"]
                results = [r["result"] for p in pushes for r in p["nodes"]]
            except (ValueError, KeyError, TypeError):
                return ran.wall, ran.problem("file push's --json is not what it should be")
            if sorted(results) != ["written"] * nodes:
                return ran.wall, ran.problem(f"not `written` on each of {nodes} nodes")
            return ran.wall, None
        salt = self.side.salt
        chunked = ["--chunked"] if system == SALT_CHUNKED else []
        command = [
            str(salt.venv / "bin" / "salt-cp"), "-c", str(salt.config_dir), "--out=json",
            "-t", str(int(self.args.command_timeout)), *chunked, "*", str(source), name,
        ]  # fmt: skip
        ran = timed(command, timeout=self.args.command_timeout)
        try:
            answers = json.loads(ran.stdout)
            good = sum(
                isinstance(a, dict) and bool(a) and all(v is True for v in a.values())
                for a in answers.values()
            )
        except (ValueError, AttributeError):
            good = 0
        if ran.code != 0 or good != nodes:
            return ran.wall, ran.problem(f"not a success from each of {nodes} minions ({good})")
        return ran.wall, None

    def measure_size(self, nodes: int) -> None:
        size: dict[str, Any] = {"load_average_before": os.getloadavg()}
        self.sizes[str(nodes)] = size
        log(f"{nodes} nodes: growing both fleets")
        size["fleets"] = self.side.grow(nodes)
        rounds: list[dict[str, Any]] = []
        size["rounds"] = rounds
        for r in range(self.args.rounds):
            chosen = [system for system in SYSTEMS if system in self.args.systems]
            order = chosen if r % 2 == 0 else chosen[::-1]
            got: dict[str, Any] = {"load_average_before": os.getloadavg()[0]}
            rounds.append(got)
            name = f"pushed-{nodes}-{r + 1}.txt"
            source, sha256 = make_file(self.work, name, self.args.size_mib << 20)
            got["sha256"] = sha256
            for system in order:
                who = "ours" if system == OURS_NAME else "salt"
                control, agents = self.side.cpu_of(who)
                began = time.time()
                wall, problem = self.send(system, source, name)
                control_after, agents_after = self.side.cpu_of(who)
                copies = self.copies(system, name)
                wrong = [problem] if problem else check_copies(copies, sha256)
                if wrong:
                    size["failed"] = {system: wrong[:10]}
                    size["summary"] = summary(rounds)
                    raise Failed(f"{nodes} nodes, round {r + 1}, {system}: {wrong[0]}")
                got[system] = {
                    "wall_s": round(wall, 3),
                    "last_copy_written_s": round(last_written(copies) - began, 3),
                    "control_cpu_s": round(control_after - control, 2),
                    "nodes_cpu_s": round(agents_after - agents, 2),
                    "checked_copies": len(copies),
                }
                for path in copies.values():
                    with contextlib.suppress(OSError):
                        path.unlink()
                log(f"{nodes} nodes, round {r + 1}, {system}: {wall:.2f} s, {len(copies)} "
                    "copies byte-identical")  # fmt: skip
            source.unlink()
            got["load_average_after"] = os.getloadavg()[0]
            size["summary"] = summary(rounds)
        size["load_average_after"] = os.getloadavg()


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per system: wall p50 and worst over the rounds, CPU p50; file push's p50 as a
    share of each salt-cp's."""
    out: dict[str, Any] = {}
    for system in SYSTEMS:
        walls = [r[system]["wall_s"] for r in rounds if system in r]
        if not walls:
            continue
        out[system] = {
            "wall_p50_s": round(statistics.median(walls), 3),
            "wall_worst_s": round(max(walls), 3),
            "last_copy_written_p50_s": statistics.median(
                r[system]["last_copy_written_s"] for r in rounds if system in r
            ),
            "control_cpu_p50_s": statistics.median(r[system]["control_cpu_s"] for r in rounds
                                                   if system in r),
            "nodes_cpu_p50_s": statistics.median(r[system]["nodes_cpu_s"] for r in rounds
                                                 if system in r),
            "rounds": len(walls),
        }  # fmt: skip
    ours = out.get(OURS_NAME, {}).get("wall_p50_s")
    for system in SYSTEMS[:2]:
        if ours and system in out:
            out[f"file push ÷ {system}"] = round(ours / out[system]["wall_p50_s"], 2)
    return out


def table(sizes: dict[str, Any]) -> str:
    lines = [
        "| nodes | command | p50 | worst | last copy written, p50 | control-plane CPU-s p50"
        " | nodes' CPU-s p50 |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for nodes, size in sizes.items():
        found = size.get("summary", {})
        for system in SYSTEMS:
            if row := found.get(system):
                lines.append(
                    f"| {nodes} | `{system}` | {row['wall_p50_s']:.2f} s |"
                    f" {row['wall_worst_s']:.2f} s | {row['last_copy_written_p50_s']:.2f} s |"
                    f" {row['control_cpu_p50_s']:.2f} |"
                    f" {row['nodes_cpu_p50_s']:.2f} |"
                )
        for system in SYSTEMS[:2]:
            if (ratio := found.get(f"file push ÷ {system}")) is not None:
                lines.append(f"| {nodes} | `file push` ÷ `{system}` (p50) | {ratio} | | | | |")
        if failed := size.get("failed"):
            lines.append(f"\n**Failed** (the figures do not count): {failed}")
    return "\n".join(lines)


def measure(run: FilePush) -> None:
    side = run.side
    if not trio.run(wait_until_servers, side.files, len(side.servers)):
        raise Failed(f"not all {len(side.servers)} servers were up")
    time.sleep(2.5)  # one more round of every edge's directory
    side.token = create_token(side.files, "bench.file_push_side_by_side")
    log(f"salt-master on {MASTER}")
    side.salt.start_master()
    for nodes in run.args.nodes:
        run.measure_size(nodes)


def run(bench: runner.Bench) -> None:
    salt = SaltFleet(bench.args.salt_venv, bench.root / "salt", MASTER)
    side = SideBySide(bench.args, bench.files, bench.servers, bench.root, bench.out, salt)
    work = bench.root / "sources"
    work.mkdir()
    push = FilePush(side, work)
    bench.out["sizes"] = push.sizes
    bench.out["salt_master"] = MASTER
    bench.progress = side.progress
    with contextlib.ExitStack() as undo:
        undo.callback(write_results, bench, "file-push-side-by-side")
        undo.callback(step, "stopping the agents", lambda: stop_all(side.agents))
        undo.callback(step, "stopping the salt-master and minions", salt.stop)
        undo.callback(show_table, bench, push)
        measure(push)


def show_table(bench: runner.Bench, push: FilePush) -> None:
    bench.out["table"] = table(push.sizes)
    log("results:\n" + bench.out["table"])


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[20], help="fleet sizes, ascending")
    parser.add_argument("--rounds", type=int, default=3, help="rounds at each size")
    parser.add_argument("--size-mib", type=int, default=10, help="the file's size, MiB")
    parser.add_argument("--servers", type=int, default=3, help="our servers, 1 to 3")
    parser.add_argument(
        "--systems",
        nargs="+",
        choices=list(SYSTEM_NAMES),
        default=list(SYSTEM_NAMES),
        type=str,
        help="what sends the file (default: all three)",
    )
    parser.add_argument(
        "--command-timeout",
        type=float,
        default=COMMAND_TIMEOUT,
        help="seconds a command may take before the run fails (salt-cp's -t too)",
    )
    parser.add_argument("--salt-venv", type=Path, default=DEFAULT_VENV, help="Salt's own venv")
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")


def check(args: argparse.Namespace) -> str | None:
    args.systems = [SYSTEM_NAMES[name] for name in args.systems]
    if sorted(set(args.nodes)) != args.nodes or args.nodes[0] < 1:
        return "--nodes: sizes of 1 or more, ascending, each once"
    if not 1 <= args.servers <= len(SERVER_ADDRESSES):
        return f"--servers: 1 to {len(SERVER_ADDRESSES)}"
    if args.rounds < 1 or not 1 <= args.size_mib <= 64:
        return "need --rounds >= 1 and --size-mib from 1 to 64 (the default cap a file)"
    return None


SCENARIO = Scenario(
    "file_push_side_by_side",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda args: SERVER_ADDRESSES[: args.servers],
    check=check,
    before_servers=before_servers,
    measured=("oz0", "cli", "oz0_node", "oz0_common", "bench"),
)
