"""`job run --all` as a fleet tool shows it, end to end: one real server (127.0.0.59; .60
kept for it) and 20 real agents. Through a real terminal (a tmux pane): the one live line of
where the parts are, redrawn in place as they end, then the recap naming the nodes that
failed or were lost. On a pipe: `--output prefixed` and `grouped`, nothing else added, and
`--json`'s recap as data. The rendering itself is tested in tests/test_job_fanout_view.py.

The parts wait for gate files the test makes (in /dev/shm: each attempt has a /tmp of its
own), so the test says when each ends.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cli.job_recap import seconds_of
from fixtures.agent import AgentProcess, joined_fleet, ready
from fixtures.cluster import REPO, ClusterFiles, Served, cli_command
from fixtures.job_calls import api, wait_job
from fixtures.tmux_pane import Pane, have_tmux

SERVER = "127.0.0.59"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{SERVER}:7443"
AGENTS = 20
# Generous for a loaded 2-core machine: a part's end reaches the command in well under 1 s.
SHOWN_WITHIN = 60.0
PROGRESS = re.compile(
    r"(job-[0-9a-f]{12}): (\d+) ok, (\d+) failed, (?:(\d+) lost, )?(\d+) running,"
    r" (\d+) waiting of (\d+)"
)


@dataclass(frozen=True)
class Fleet:
    files: ClusterFiles
    agents: list[AgentProcess]

    def accepted(self) -> list[str]:
        """The IDs of the fleet's nodes accepted now (one a failed test left blocked is not)."""
        found = api(self.files).get("/api/v1/nodes", {"state": "accepted", "limit": 100})
        return sorted(n["id"] for n in found["nodes"])


@pytest.fixture(scope="module")
def fleet(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fanout-agents")
    with joined_fleet(served.files, EDGE, root, [{}] * AGENTS) as agents:
        yield Fleet(served.files, agents)


@pytest.fixture
def gates() -> Iterator[Path]:
    """Where the test puts a part's gate: a directory every attempt's UID may look in."""
    path = Path(tempfile.mkdtemp(prefix="oz0-fanout-", dir="/dev/shm"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        for gate in path.iterdir():
            gate.unlink()
        path.rmdir()


def gated(gates: Path) -> list[str]:
    """The command of each part: it waits for its gate (or the gate of all), prints that it
    is done and exits 3 if the test made it fail."""
    g = shlex.quote(str(gates))
    script = (
        f'while [ ! -e {g}/go-"$OZ0_NODE_ID" ] && [ ! -e {g}/go-all ]; do sleep 0.2; done;'
        f' echo "done $OZ0_NODE_ID"; [ ! -e {g}/fail-"$OZ0_NODE_ID" ] || exit 3'
    )
    return ["sh", "-c", script]


def cli_env(files: ClusterFiles) -> dict[str, str]:
    return {**os.environ, **files.cli_env, "PYTHONPATH": str(REPO)}


def progress_lines(screen: list[str]) -> list[tuple[int, ...]]:
    """Each live line on the screen: (ok, failed, lost, running, waiting, of)."""
    found = []
    for line in screen:
        match = PROGRESS.search(line)
        if match:
            ok, failed, lost, running, waiting, total = match.groups()[1:]
            found.append(tuple(int(n or 0) for n in (ok, failed, lost, running, waiting, total)))
    return found


def shows(state: tuple[int, ...]) -> Any:
    return lambda screen: progress_lines(screen) == [state]


@pytest.mark.skipif(not have_tmux(), reason="no tmux (apt-get install tmux)")
def test_a_terminal_shows_one_live_line_of_the_parts_then_the_recap(
    fleet: Fleet, gates: Path, tmp_path: Path
) -> None:
    nodes = fleet.accepted()
    n = len(nodes)
    assert n == AGENTS, "a node of the fleet is not accepted"
    first, rest = nodes[:10], nodes[10:]
    failing, blocked = first[:2], rest[0]
    command = [*cli_command("job", "run", "--all", "--"), *gated(gates)]
    script = tmp_path / "run.sh"
    env = {k: cli_env(fleet.files)[k] for k in ("PYTHONPATH", "OZ0_CONTEXT", "XDG_CONFIG_HOME")}
    script.write_text(
        "".join(f"export {k}={shlex.quote(v)}\n" for k, v in env.items())
        + f"cd {shlex.quote(str(REPO))}\n{shlex.join(command)}\necho EXITED $?\nexec sleep 600\n"
    )
    pane = Pane.running(script)
    try:
        pane.wait_for("every part running", shows((0, 0, 0, n, 0, n)), SHOWN_WITHIN)
        for node in failing:
            (gates / f"fail-{node}").touch()
        for node in first:
            (gates / f"go-{node}").touch()
        # The line was redrawn where it was: still one line, now with ten parts ended.
        screen = pane.wait_for("ten parts ended", shows((8, 2, 0, 10, 0, n)), SHOWN_WITHIN)
        assert sorted(line for line in screen if line.startswith("done ")) == sorted(
            f"done {node}" for node in first
        )
        api(fleet.files).post(f"/api/v1/nodes/{blocked}/block", {"reason": "fan-out test"})
        pane.wait_for("a part lost", shows((8, 2, 1, 9, 0, n)), SHOWN_WITHIN)
        (gates / "go-all").touch()
        screen = pane.wait_for(
            "the command's end", lambda s: any(line.startswith("EXITED") for line in s), 60
        )
        job_id = next(m.group(0) for line in screen if (m := re.search(r"job-[0-9a-f]{12}", line)))
        job = wait_job(fleet.files, job_id, lambda j: j["ended_at"] is not None, 10)
        assert progress_lines(screen) == [], "the live line was wiped at the end"
        recap = screen[screen.index(next(s for s in screen if s.startswith("RECAP"))) :]
        took = f"{job_seconds(job):g}"
        assert recap[:3] == [
            f"RECAP {job_id}: failed in {took} s on {n} nodes",
            f"  ok={n - 3}  failed=2  lost=1",
            f"  exit codes: 0={n - 3}  3=2",
        ]
        assert recap[3].startswith(f"  {blocked}  lost    node blocked"), recap
        assert recap[4:6] == [f"  {node}  failed  exit code 3" for node in failing]
        assert recap[6:] == ["EXITED 3"]
        assert job["exit_code"] == 3
    finally:
        pane.close()
        unblock(fleet, blocked)


def job_seconds(job: dict[str, Any]) -> float:
    took = seconds_of(job)
    assert took is not None
    return took


def unblock(fleet: Fleet, node: str) -> None:
    """The fleet whole again for the module's other tests (if the node was blocked)."""
    shown = api(fleet.files).get(f"/api/v1/nodes/{node}")
    if shown["state"] != "blocked":
        return
    api(fleet.files).post("/api/v1/nodes/unblock", {"ids": [node]})
    for agent in fleet.agents:
        if agent.reported().get("node_id") == node:
            agent.wait_reported(ready, timeout=60)


def run_piped(fleet: Fleet, *args: str, command: list[str]) -> subprocess.CompletedProcess[bytes]:
    """`job run --all ARGS -- COMMAND` with stdout and stderr pipes (not a terminal)."""
    return subprocess.run(
        [*cli_command("job", "run", "--all", *args, "--"), *command],
        capture_output=True, env=cli_env(fleet.files), cwd=REPO, timeout=120,
    )  # fmt: skip


# Every part writes a line in two pieces, a line to stderr, and ends with a line unended
# that holds an escape: pieces of different nodes come between each other's.
TWO_PIECES = [
    "sh", "-c",
    'printf "one-"; sleep 0.3; echo "$OZ0_NODE_ID"; printf "err-%s" "$OZ0_NODE_ID" >&2;'
    ' printf "\\033[2Jlast"',
]  # fmt: skip


def test_prefixed_and_grouped_on_a_pipe_keep_each_line_whole_and_add_nothing_else(
    fleet: Fleet,
) -> None:
    nodes = fleet.accepted()
    prefixed = run_piped(fleet, "--output", "prefixed", command=TWO_PIECES)
    assert prefixed.returncode == 0, prefixed.stderr
    assert sorted(prefixed.stdout.decode().splitlines()) == sorted(
        [f"{n}: one-{n}" for n in nodes] + [f"{n}: \\x1b[2Jlast" for n in nodes]
    )
    # Not a terminal and not asked: no live line, no recap; only the nodes' own stderr.
    assert sorted(prefixed.stderr.decode().splitlines()) == sorted(f"{n}: err-{n}" for n in nodes)

    grouped = run_piped(fleet, "--output", "grouped", command=TWO_PIECES)
    assert grouped.returncode == 0, grouped.stderr
    lines = grouped.stdout.decode().splitlines()
    blocks = [lines[i : i + 3] for i in range(0, len(lines), 3)]
    assert sorted(blocks) == sorted(
        [f"--- {n}: exit code 0", f"one-{n}", "\\x1b[2Jlast"] for n in nodes
    )
    assert sorted(grouped.stderr.decode().splitlines()) == sorted(f"err-{n}" for n in nodes)


def test_json_is_the_recap_as_data_and_progress_asked_on_a_pipe_is_a_line_per_change(
    fleet: Fleet,
) -> None:
    nodes = fleet.accepted()
    odd = nodes[0]
    command = ["sh", "-c", f'echo hi; [ "$OZ0_NODE_ID" != {odd} ] || exit 5']
    ran = run_piped(fleet, "--json", command=command)
    assert ran.returncode == 5, ran.stderr
    recap = json.loads(ran.stdout)  # nothing else on stdout: the output stays in the cluster
    assert recap["nodes"] == len(nodes) and recap["state"] == "failed"
    assert {k: v for k, v in recap["outcomes"].items() if v} == {"ok": len(nodes) - 1, "failed": 1}
    assert recap["exit_codes"] == {"0": len(nodes) - 1, "5": 1}
    assert [(p["node"], p["exit_code"]) for p in recap["parts"] if p["outcome"] != "ok"] == [
        (odd, 5)
    ]

    asked = run_piped(fleet, "--progress", command=command)
    assert asked.returncode == 5
    err = asked.stderr.decode().splitlines()
    shown = progress_lines(err)
    assert shown[-1] == (len(nodes) - 1, 1, 0, 0, 0, len(nodes))
    assert len(set(shown)) == len(shown), "a line per change, not per page"
    assert any(line.startswith("RECAP job-") for line in err)
    assert f"  {odd}  failed  exit code 5" in err
    assert asked.stdout.decode() == "hi\n" * len(nodes)  # raw, as before
