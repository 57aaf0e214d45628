"""orchestrator-zero side by side with SaltStack 3008 on this machine (issue 31, item 3).

    python -m bench.salt_side_by_side [--nodes 20 50 100] [--rounds R] [--servers S]
                                      [--commands C] [--submitters K] [--salt-venv DIR]
                                      [--results-dir DIR] [--server-logs DIR]
                                      [--fail salt|ours]

Salt: `salt==3008.*` in a venv of its own (--salt-venv, made and filled if it has no
`salt`; never the project's venv), one salt-master on 127.0.0.184 (its default ports 4505
and 4506) and minions node-1..node-N, every file in the run's temporary directory
(bench/salt.py). orchestrator-zero: the runner (bench/runner.py) starts a fresh test
cluster and S real servers (default 3, at most 3) on 127.0.0.185, .186 and .187; then N
real agents (`python -m oz0_node.main start`, fixtures/agent.py) joined with one unlimited
token, agent i given edge i % S first. Both fleets grow together to each size of --nodes
in turn (ascending), and at each size, once both idle, their memory (RSS of the agents'
and minions' process trees; of the servers and Temporal hosts and of the master) and their
CPU over IDLE seconds are taken.

Then R rounds; in each, every measure is taken for both, one after the other, Salt first
in even rounds and ours first in odd ones, each command as an operator types it (the
venvs' console scripts; ours with OZ0_CONTEXT set to the cluster's context, Salt's with
`-c` naming the master's configuration):

- CLI start-up: `salt --version` and `orchestrator-zero --version`, the median of
  STARTUP_RUNS each;
- fan-out: `salt '*' cmd.run /bin/true` and `orchestrator-zero job run --all -- true`
  (Salt's CLI reads `true` as YAML's boolean and would run `True`: not found, exit 127);
- one named node: `salt node-1 cmd.run /bin/true` and `orchestrator-zero job run --node ID
  -- true` (node-1's agent's ID: a node is named by its ID here, as a minion by its);
- burst: C commands from K submitters at once, each a loop of CLI processes one after the
  other, command j of submitter k on node (k * C/K + j) % N + 1: commands a second;
- the same three through each one's API, without a CLI process: Salt's LocalClient in a
  process of the Salt venv (bench/salt_client.py, one client kept, a process of its own
  per submitter) and our API as `job run` calls it (cli.client.ApiClient: POST the job,
  then read its output to its end as the CLI's follower does), threads in this process.

"Less start-up" figures are the CLI's time minus that round's median start-up (a burst:
minus C/K start-ups, what each submitter's loop paid). Each figure is summarised as its
p50 and its worst over the rounds. Every command is checked: Salt's by the minions that
answered (each with exit code 0 and no output), ours by exit code and, at the end of a
size, by the rows (every job succeeded, an --all job with one successful attempt a node).

It prints a markdown table on stderr and the runner's JSON document on stdout, and writes
the document (Salt's version and ours, the commit, the load average before and after each
size, the date) to --results-dir (default /work/bench-results; not in the repository).
The first command that fails (or whose answers are short of a minion or a node), the
first wait that runs out, and rows that do not say what the commands said end the run at
once: the table so far and the failures (each command, its exit, the end of its output) on
stderr and in the document, exit status 1. Every wait has a bound (a command COMMAND_TIMEOUT,
its whole session killed then; a followed job JOB_TIMEOUT; a burst CLIENT_TIMEOUT, in daemon
threads that cannot hold the exit); the Salt API client, the minions, the master and the
agents are stopped however the run ends, all at once and within bounds, then the servers.
`--fail salt|ours` makes that side run a program no node has, to see the run so end.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import functools
import io
import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import trio

from bench import runner
from bench.measure import CLK_TCK, cpu_seconds
from bench.runner import Scenario, create_token, log, wait_until_servers
from bench.salt import DEFAULT_VENV, SaltFailed, SaltFleet, ensure_venv
from cli.client import ApiClient
from cli.job_cmds import output_fetch
from cli.job_follow import Follower
from fixtures.agent import AgentProcess, stop_all
from fixtures.cluster import ClusterFiles, ServerProcess
from oz0 import __version__
from oz0.context import MANAGEMENT_PORT, Context
from oz0_common.addresses import EDGE_PORT

MASTER = "127.0.0.184"
SERVER_ADDRESSES = ("127.0.0.185", "127.0.0.186", "127.0.0.187")
RESULTS_DIR = Path("/work/bench-results")
SALT_CLIENT = Path(__file__).resolve().parent.parent / "salt_client.py"
# Our CLI, as an operator types it: the venv's console script (as bench/cli_start.py).
OURS = str(Path(sys.executable).with_name("orchestrator-zero"))

STARTUP_RUNS = 5
# Bounds, so that a fleet that stops answering cannot keep the run going.
AGENTS_UP_TIMEOUT = 300.0
COMMAND_TIMEOUT = 300.0
CLIENT_TIMEOUT = 900.0
BARRIER_TIMEOUT = 60.0
# Our job through the API, followed to its end (job_to_end): a lost part ends its job
# within its lost-after (15 s by default); this bounds a job that would never end.
JOB_TIMEOUT = 300.0
SETTLE = 5.0  # after a fleet grew, before it counts as idle

# The measures, in the order they are taken and shown: (key, what the table calls it,
# unit). Times are seconds; "/s" is commands a second, where more is better.
MEASURES: tuple[tuple[str, str, str], ...] = (
    ("start", "CLI start-up (`--version`)", "s"),
    ("fanout", "fan-out (`salt '*'` / `job run --all`)", "s"),
    ("fanout_less_start", "fan-out, less CLI start-up", "s"),
    ("fanout_api", "fan-out through the API", "s"),
    ("one", "one named node", "s"),
    ("one_less_start", "one named node, less CLI start-up", "s"),
    ("one_api", "one named node through the API", "s"),
    ("burst", "{C} commands from {K} CLIs", "/s"),
    ("burst_less_start", "{C} commands from {K} CLIs, less start-up", "/s"),
    ("burst_api", "{C} commands from {K} API clients", "/s"),
)
# The CPU each command cost, per measure of commands: the control plane's (Salt's master;
# our servers, their Temporal hosts and PostgreSQL) and the nodes' (minions; agents and
# what they ran), in CPU-seconds a command (an `--all` job, a `salt '*'` is one).
MEASURES += tuple(
    (f"{name}_{side}_cpu", f"{label}: {who} CPU-s a command", "CPU-s")
    for name, label in (
        ("fanout", "fan-out by CLI"), ("one", "one named node by CLI"),
        ("burst", "{C} commands from {K} CLIs"), ("fanout_api", "fan-out by API"),
        ("one_api", "one named node by API"), ("burst_api", "{C} commands by API"),
    )
    for side, who in (("control", "control plane"), ("nodes", "nodes'"))
)  # fmt: skip
SYSTEMS = ("salt", "ours")
# Salt's CLI reads each argument as YAML: `cmd.run true` would run `True` (not found, exit
# 127 on every minion). A path is a string in YAML and runs the same program.
SALT_TRUE = "/bin/true"
# What --fail runs instead, on one side: a check that a failed command ends the run at once.
MISSING = "/bin/no-such-command"


T = TypeVar("T")


class Failed(Exception):
    """A fleet did not do what the benchmark needs: the run ends at once, non-zero."""


# --- processes: memory and CPU of trees ----------------------------------------------------


def _children() -> dict[int, list[int]]:
    """Every process's children, by parent (from /proc)."""
    found: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            found.setdefault(parent, []).append(int(stat.parent.name))
    return found


def tree(roots: list[int]) -> list[int]:
    """ROOTS and all their descendants now."""
    children = _children()
    out, todo = [], list(roots)
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return out


def rss_total_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return round(total / 1024, 1)


def cpu_total(pids: list[int]) -> dict[int, float]:
    return {pid: s for pid in pids if not math.isnan(s := cpu_seconds(pid))}


def cpu_with_reaped(pids: list[int]) -> float:
    """CPU-seconds of PIDS and of the children each has reaped (utime, stime, cutime and
    cstime): the difference of two readings of a tree counts what it spent between them,
    processes born and gone meanwhile too (a minion's job, a supervisor) once their parent
    in the tree reaped them; what a process outside the tree reaped is not counted."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += sum(int(v) for v in fields[11:15]) / CLK_TCK
    return total


def postgres_tree() -> list[int]:
    """PostgreSQL's postmaster and its backends (the cluster's database: our control
    plane's share; Salt uses none)."""
    roots = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            if comm.read_text().strip() != "postgres":
                continue
            parent = int((comm.parent / "stat").read_text().rsplit(")", 1)[1].split()[1])
            if Path(f"/proc/{parent}/comm").read_text().strip() != "postgres":
                roots.append(int(comm.parent.name))
    return tree(roots)


# --- timing --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ran:
    """One command as an operator typed it: how long it took and what it said."""

    command: list[str]
    wall: float
    code: int  # -1: killed at COMMAND_TIMEOUT
    stdout: str
    stderr: str

    def problem(self, why: str) -> str:
        """WHY it failed, with the command, its exit and the end of what it printed."""
        said = " / ".join(
            line for text in (self.stdout[-400:], self.stderr[-400:]) for line in text.splitlines()
        )
        exited = "killed at its timeout" if self.code == -1 else f"exit {self.code}"
        return f"{why}: `{' '.join(self.command)}` ({exited}): {said or 'no output'}"


def timed(
    command: list[str], env: dict[str, str] | None = None, timeout: float = COMMAND_TIMEOUT
) -> Ran:
    """COMMAND run to its end, within TIMEOUT. In a session of its own, so that a timeout
    kills what it forked too: a child left holding its pipes would make the read of its
    output wait forever (subprocess.run's own timeout kills the child alone)."""
    began = time.perf_counter()
    process = subprocess.Popen(
        command,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        try:
            out, err = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:  # pipes held by something outside its session
            process.kill()
            out, err = "", ""
        code = -1
    return Ran(command, time.perf_counter() - began, code, out or "", err or "")


def within(seconds: float, what: str, call: Callable[[], T]) -> T:
    """CALL() in a thread of its own, given SECONDS: Failed (naming WHAT) if it is not done
    by then. A daemon thread, so one left waiting cannot hold the process's exit."""
    box: list[T] = []
    errors: list[BaseException] = []

    def target() -> None:
        try:
            box.append(call())
        except BaseException as e:  # handed to the caller's thread
            errors.append(e)

    thread = threading.Thread(target=target, name=what, daemon=True)
    thread.start()
    thread.join(seconds)
    if errors:
        raise errors[0]
    if not box:
        raise Failed(f"{what}: not done within {seconds:g} s")
    return box[0]


def burst_of(
    targets: list[list[str]], one: Callable[[str], str | None]
) -> tuple[float, int, list[str]]:
    """Each list of TARGETS in a thread of its own, ONE(target) on each in turn (None when
    it succeeded, else what went wrong), all at once: the wall time from the first start to
    the last end, how many succeeded, what went wrong (the first ten). Failed if a
    submitter is not done within CLIENT_TIMEOUT: its daemon thread is left behind, and
    cannot hold the process's exit (a pool's threads are joined at exit, without a bound)."""
    gate = threading.Barrier(len(targets) + 1)
    spans: list[tuple[float, float, int]] = []
    errors: list[str] = []

    def submitter(mine: list[str]) -> None:
        try:
            gate.wait(BARRIER_TIMEOUT)
        except threading.BrokenBarrierError:
            errors.append("the submitters' start did not come together")
            return
        began, ok = time.perf_counter(), 0
        for target in mine:
            try:
                problem = one(target)
            except Exception as e:  # counted, not raised: the others go on
                problem = f"{type(e).__name__}: {e}"
            if problem is None:
                ok += 1
            else:
                errors.append(f"{target}: {problem}"[:600])
        spans.append((began, time.perf_counter(), ok))

    threads = [threading.Thread(target=submitter, args=(mine,), daemon=True) for mine in targets]
    for thread in threads:
        thread.start()
    gate.wait(BARRIER_TIMEOUT)
    deadline = time.monotonic() + CLIENT_TIMEOUT
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    if any(thread.is_alive() for thread in threads):
        late = sum(thread.is_alive() for thread in threads)
        raise Failed(f"{late} of {len(threads)} submitters not done within {CLIENT_TIMEOUT:g} s;"
                     f" errors so far: {errors[:5]}")  # fmt: skip
    if not spans:
        return 0.0, 0, errors[:10]
    wall = max(s[1] for s in spans) - min(s[0] for s in spans)
    return wall, sum(s[2] for s in spans), errors[:10]


def spread(commands: int, submitters: int, nodes: int) -> list[list[int]]:
    """Submitter k's nodes (1-based): command j of k on node (k * C/K + j) % N + 1."""
    each = [commands // submitters + (k < commands % submitters) for k in range(submitters)]
    out, first = [], 0
    for count in each:
        out.append([(first + j) % nodes + 1 for j in range(count)])
        first += count
    return out


# --- Salt through its API ------------------------------------------------------------------


@dataclass(eq=False)
class SaltClient:
    """bench/salt_client.py in the Salt venv: requests and answers, a JSON line each."""

    process: subprocess.Popen[str]

    @classmethod
    def start(cls, fleet: SaltFleet) -> SaltClient:
        process = subprocess.Popen(
            # -P: not its own directory first on the path, where bench/operator.py would
            # shadow the standard library's operator.
            [str(fleet.venv / "bin" / "python"), "-P", str(SALT_CLIENT), str(fleet.config_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=(fleet.root / "salt_client.log").open("a"),
            text=True,
            # Its burst's worker processes are stopped with it (stop).
            start_new_session=True,
        )
        client = cls(process)
        client._answer(60.0)  # {"ready": true} once its LocalClient is made
        return client

    def ask(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self._answer(CLIENT_TIMEOUT)

    def _answer(self, within: float) -> dict[str, Any]:
        assert self.process.stdout is not None
        ready, _, _ = select.select([self.process.stdout], [], [], within)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            raise Failed(f"bench/salt_client.py did not answer within {within} s")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def stop(self) -> None:
        """It and the workers of a burst under way: SIGKILL to its session."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)


# --- ours through its API ------------------------------------------------------------------


def job_to_end(client: ApiClient, body: dict[str, Any], program: str = "true") -> str | None:
    """What `job run` does without its process: POST the job, read its output to the end
    (cli.job_follow, as the CLI does), output discarded. None if it succeeded, else how it
    ended. Failed if it has not ended within JOB_TIMEOUT."""
    job = client.post("/api/v1/jobs", {"tenant": "default", "command": [program], **body})
    fetch = output_fetch(client, job["id"])
    follower = Follower(fetch, io.BytesIO(), io.BytesIO(), headers="moves")
    ended = within(JOB_TIMEOUT, f"job {job['id']}", lambda: follower.run(follow=True))
    if ended.get("state") == "succeeded":
        return None
    return f"job {job['id']} ended {ended.get('state')}: {ended.get('reason') or '-'}"


# --- the run -------------------------------------------------------------------------------


@dataclass
class SideBySide:
    args: argparse.Namespace
    files: ClusterFiles
    servers: dict[str, ServerProcess]
    root: Path
    out: dict[str, Any]
    salt: SaltFleet
    agents: list[AgentProcess] = field(default_factory=list)
    node_ids: list[str] = field(default_factory=list)
    salt_client: SaltClient | None = None
    sizes: dict[str, Any] = field(default_factory=dict)
    token: str = ""

    def progress(self) -> dict[str, Any]:
        return {
            "agents_running": sum(a.running() for a in self.agents),
            "minions_running": sum(m.poll() is None for m in self.salt.minions),
            "sizes_done": list(self.sizes),
        }

    def stop_salt_client(self) -> None:
        if self.salt_client is not None:
            self.salt_client.stop()

    @property
    def env(self) -> dict[str, str]:
        return dict(os.environ, OZ0_CONTEXT=str(self.files.context_path))

    @functools.cached_property
    def api(self) -> ApiClient:
        """One client for the run, its connections kept, as Salt's LocalClient is kept."""
        context = Context.load(self.files.context_path)
        first = f"{next(iter(self.servers))}:{MANAGEMENT_PORT}"
        return ApiClient(dataclasses.replace(context, servers=(first,)))

    # --- the fleets ----------------------------------------------------------------------

    def grow(self, nodes: int) -> dict[str, Any]:
        """Both fleets to NODES: agents and minions started side by side."""
        edges = [f"{address}:{EDGE_PORT}" for address in self.servers]
        base = self.root / "agents"
        base.mkdir(exist_ok=True)
        began = time.monotonic()
        for i in range(len(self.agents), nodes):
            agent = AgentProcess.joining(
                base / f"node-{i + 1}",
                edges[i % len(edges) :] + edges[: i % len(edges)],
                self.files.ca_hash,
                token=self.token,
            )
            self.agents.append(agent.start())
        salt_s = self.salt.add_minions(nodes, timeout=AGENTS_UP_TIMEOUT + nodes * 3.0)
        deadline = began + AGENTS_UP_TIMEOUT
        while True:
            reports = [a.reported() for a in self.agents]
            up = sum(r.get("runtime") == "running" and r.get("connected") is True for r in reports)
            if up == nodes:
                break
            if time.monotonic() > deadline:
                dead = [a for a in self.agents if not a.running()] or self.agents
                raise Failed(f"only {up} of {nodes} agents run:\n{dead[0].log()[-1500:]}")
            time.sleep(0.5)
        self.node_ids = [str(r["node_id"]) for r in reports]
        return {"up_s_both": round(time.monotonic() - began, 1), "salt_ping_s": round(salt_s, 1)}

    def idle(self) -> dict[str, Any]:
        """Memory and CPU of both fleets, idle for --idle seconds."""
        time.sleep(SETTLE)
        minions = tree([m.pid for m in self.salt.minions])
        master = tree([self.salt.master.pid] if self.salt.master else [])
        agents = tree([a.process.pid for a in self.agents if a.process is not None])
        servers = tree([s.pid for s in self.servers.values() if s.pid is not None])
        groups = {"minions": minions, "master": master, "agents": agents, "servers": servers}
        before = {name: cpu_total(pids) for name, pids in groups.items()}
        time.sleep(self.args.idle)
        after = {name: cpu_total(pids) for name, pids in groups.items()}

        def busy(name: str) -> float:
            spent = sum(after[name][p] - s for p, s in before[name].items() if p in after[name])
            return round(100 * spent / float(self.args.idle), 1)

        return {
            "rss_mib": {name: rss_total_mib(pids) for name, pids in groups.items()},
            "processes": {name: len(pids) for name, pids in groups.items()},
            "idle_cpu_percent": {name: busy(name) for name in groups},
            "idle_s": self.args.idle,
        }

    # --- the measures, one system at a time ----------------------------------------------

    def cpu_of(self, system: str) -> tuple[float, float]:
        """SYSTEM's control plane's and nodes' CPU-seconds so far (cpu_with_reaped)."""
        if system == "salt":
            control = tree([self.salt.master.pid] if self.salt.master else [])
            nodes = tree([m.pid for m in self.salt.minions])
        else:
            control = tree([s.pid for s in self.servers.values() if s.pid is not None])
            control += postgres_tree()
            nodes = tree([a.process.pid for a in self.agents if a.process is not None])
        return cpu_with_reaped(control), cpu_with_reaped(nodes)

    def costed(
        self,
        got: dict[str, dict[str, float]],
        name: str,
        system: str,
        commands: int,
        measure: Callable[[], T],
    ) -> T:
        """MEASURE's result, its CPU a command (of COMMANDS) recorded in GOT under NAME."""
        control, nodes = self.cpu_of(system)
        result = measure()
        control_after, nodes_after = self.cpu_of(system)
        got.setdefault(f"{name}_control_cpu", {})[system] = (control_after - control) / commands
        got.setdefault(f"{name}_nodes_cpu", {})[system] = (nodes_after - nodes) / commands
        return result

    def start_up(self, system: str) -> float:
        command = [str(self.salt.venv / "bin" / "salt"), "--version"] if system == "salt" else [
            OURS, "--version"
        ]  # fmt: skip
        walls = []
        for _ in range(STARTUP_RUNS):
            ran = timed(command, self.env)
            if ran.code != 0:
                raise Failed(ran.problem(f"{system}'s CLI did not start"))
            walls.append(ran.wall)
        return statistics.median(walls)

    def program(self, system: str) -> str:
        """What SYSTEM runs: `true`, or with --fail SYSTEM a program no node has."""
        if self.args.fail == system:
            return MISSING
        return SALT_TRUE if system == "salt" else "true"

    def salt_cli(self, target: str, expect: int) -> tuple[float, str | None]:
        ran = timed(self.salt.command(target, "cmd.run", self.program("salt")))
        # Each minion that answered prints its ID and a colon; `true` prints nothing more.
        names = {f"node-{i}:" for i in range(1, len(self.agents) + 1)}
        answered = sum(line.rstrip() in names for line in ran.stdout.splitlines())
        if ran.code != 0 or answered != expect or len(ran.stdout.splitlines()) != expect:
            why = f"not a clean answer from each of {expect} minions ({answered} answered)"
            return ran.wall, ran.problem(why)
        return ran.wall, None

    def ours_cli(self, how: list[str]) -> tuple[float, str | None]:
        ran = timed([OURS, "job", "run", *how, "--", self.program("ours")], self.env)
        return ran.wall, None if ran.code == 0 else ran.problem("the job did not succeed")

    def fanout(self, system: str) -> tuple[float, str | None]:
        nodes = len(self.agents)
        if system == "salt":
            return self.salt_cli("*", nodes)
        return self.ours_cli(["--all"])

    def one(self, system: str) -> tuple[float, str | None]:
        if system == "salt":
            return self.salt_cli("node-1", 1)
        return self.ours_cli(["--node", self.node_ids[0]])

    def burst(self, system: str) -> tuple[float, int, list[str]]:
        lists = spread(self.args.commands, self.args.submitters, len(self.agents))
        if system == "salt":
            return burst_of(
                [[f"node-{n}" for n in mine] for mine in lists],
                lambda target: self.salt_cli(target, 1)[1],
            )
        return burst_of(
            [[self.node_ids[n - 1] for n in mine] for mine in lists],
            lambda node: self.ours_cli(["--node", node])[1],
        )

    def salt_api(self, target: str, expect: int) -> tuple[float, str | None]:
        assert self.salt_client is not None
        program = self.program("salt")
        answer = self.salt_client.ask({"op": "cmd", "target": target, "program": program})
        if answer["returned"] != expect:
            returned = answer["returned"]
            return float(answer["wall"]), f"LocalClient: {returned} of {expect} minions returned 0"
        return float(answer["wall"]), None

    def ours_api(self, body: dict[str, Any]) -> tuple[float, str | None]:
        began = time.perf_counter()
        problem = job_to_end(self.api, body, self.program("ours"))
        return time.perf_counter() - began, problem

    def fanout_api(self, system: str) -> tuple[float, str | None]:
        if system == "salt":
            return self.salt_api("*", len(self.agents))
        return self.ours_api({"all": True})

    def one_api(self, system: str) -> tuple[float, str | None]:
        if system == "salt":
            return self.salt_api("node-1", 1)
        return self.ours_api({"node": self.node_ids[0]})

    def burst_api(self, system: str) -> tuple[float, int, list[str]]:
        lists = spread(self.args.commands, self.args.submitters, len(self.agents))
        if system == "salt":
            assert self.salt_client is not None
            targets = [[f"node-{n}" for n in mine] for mine in lists]
            answer = self.salt_client.ask({"op": "burst", "targets": targets})
            return float(answer["wall"]), int(answer["returned"]), list(answer["errors"])
        client = self.api
        return burst_of(
            [[self.node_ids[n - 1] for n in mine] for mine in lists],
            lambda node: job_to_end(client, {"node": node}, self.program("ours")),
        )

    # --- a size ---------------------------------------------------------------------------

    def measure_size(self, nodes: int) -> None:
        size: dict[str, Any] = {"load_average_before": os.getloadavg()}
        self.sizes[str(nodes)] = size
        log(f"{nodes} nodes: growing both fleets")
        size["fleets"] = self.grow(nodes)
        if self.salt_client is None:  # made once the master has minions
            self.salt_client = SaltClient.start(self.salt)
        size["idle"] = self.idle()
        log(f"{nodes} nodes idle: {json.dumps(size['idle'])}")
        since = dt.datetime.now(dt.UTC)
        rounds: list[dict[str, dict[str, float]]] = []
        failures: Counter[str] = Counter()
        size["rounds"] = rounds
        size["failures"] = failures
        per_submitter = math.ceil(self.args.commands / self.args.submitters)

        def stop_if_failed(what: str, problems: list[str], count: int = 1) -> None:
            """A command that failed ends the run now: figures of a fleet that does not do
            what it is asked do not count, and the operator wants the reason, not a wait."""
            if not problems:
                return
            failures[what] += count
            size["failed_commands"] = {what: problems[:10]}
            size["summary"] = summary(rounds)
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise Failed(f"{nodes} nodes, {what}: {problems[0]}{more}")

        for r in range(self.args.rounds):
            order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
            got: dict[str, dict[str, float]] = {m[0]: {} for m in MEASURES}
            got["load_average"] = {"before": os.getloadavg()[0]}
            rounds.append(got)  # a failure below still shows what this round measured
            label = f"round {r + 1}"
            for system in order:
                got["start"][system] = self.start_up(system)
            for name, measure in (("fanout", self.fanout), ("one", self.one)):
                for system in order:
                    wall, problem = self.costed(got, name, system, 1, partial(measure, system))
                    stop_if_failed(f"{name} {system}, {label}", [problem] if problem else [])
                    got[name][system] = wall
                    got[f"{name}_less_start"][system] = wall - got["start"][system]
            for system in order:
                wall, done, errors = self.costed(
                    got, "burst", system, self.args.commands, partial(self.burst, system)
                )
                stop_if_failed(f"burst {system}, {label}", errors or (
                    [f"{done} of {self.args.commands} succeeded"]
                    if done != self.args.commands else []
                ), self.args.commands - done)  # fmt: skip
                got["burst"][system] = self.args.commands / wall
                less = wall - per_submitter * got["start"][system]
                got["burst_less_start"][system] = self.args.commands / less if less > 0 else 0.0
            for name, api_measure in (("fanout_api", self.fanout_api), ("one_api", self.one_api)):
                for system in order:
                    wall, problem = self.costed(got, name, system, 1, partial(api_measure, system))
                    stop_if_failed(f"{name} {system}, {label}", [problem] if problem else [])
                    got[name][system] = wall
            for system in order:
                wall, done, errors = self.costed(
                    got,
                    "burst_api",
                    system,
                    self.args.commands,
                    partial(self.burst_api, system),
                )
                stop_if_failed(f"burst_api {system}, {label}", errors or (
                    [f"{done} of {self.args.commands} succeeded"]
                    if done != self.args.commands else []
                ), self.args.commands - done)  # fmt: skip
                got["burst_api"][system] = self.args.commands / wall
            got["load_average"]["after"] = os.getloadavg()[0]
            size["summary"] = summary(rounds)
            log(f"{nodes} nodes, round {r + 1}: {json.dumps(got)}")
        size["ours_checked"] = checked = self.check_ours(since, nodes)
        if not checked_ok(checked):
            stop_if_failed("our jobs' rows", [f"not as every command said: {checked}"])
        size["load_average_after"] = os.getloadavg()

    def check_ours(self, since: dt.datetime, nodes: int) -> dict[str, Any]:
        """Our jobs since SINCE, from the rows: each succeeded, each --all job with one
        successful attempt on every node."""
        url = self.files.main_db
        with psycopg.connect(url, autocommit=True) as conn:
            rows = conn.execute(
                "SELECT j.all_nodes, j.state, count(a.*) FILTER (WHERE a.exit_code = 0), j.id"
                " FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id"
                " WHERE j.created_at >= %s GROUP BY j.id",
                (since,),
            ).fetchall()
            odd = [str(r[3]) for r in rows if (r[2] != nodes if r[0] else r[2] != 1)][:5]
            # What the odd jobs' attempts were, to tell a part run twice from one missing.
            attempts = conn.execute(
                "SELECT job_id, number, node_id, state, ended_because, exit_code, streamed"
                " FROM job_attempts a WHERE job_id = ANY(%s) AND (exit_code IS DISTINCT FROM 0"
                " OR (SELECT count(*) FROM job_attempts b WHERE b.job_id = a.job_id"
                "     AND b.node_id = a.node_id) > 1)"
                " ORDER BY job_id, node_id, number LIMIT 50",
                (odd,),
            ).fetchall()
            parts = conn.execute(
                "SELECT job_id, count(*), count(DISTINCT node_id) FROM job_attempts"
                " WHERE job_id = ANY(%s) GROUP BY job_id",
                (odd,),
            ).fetchall()
        expected = self.args.rounds * (2 + 2 + 2 * self.args.commands)
        return {
            "jobs": len(rows),
            "jobs_expected": expected,
            "states": dict(Counter(str(r[1]) for r in rows)),
            "all_jobs_short_of_nodes": sum(bool(r[0]) and r[2] != nodes for r in rows),
            "one_node_jobs_without_one_success": sum(not r[0] and r[2] != 1 for r in rows),
            "odd_jobs": [
                {
                    "job": j,
                    "attempts": n,
                    "nodes": k,
                    "not_exit_0_or_extra": [list(map(str, a)) for a in attempts if a[0] == j],
                }
                for j, n, k in parts
            ],
        }


def summary(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    """Per measure and system: p50 and worst over the rounds (the slowest time, the lowest
    rate); and our p50 time as a share of Salt's (for rates, Salt's rate over ours)."""
    out: dict[str, Any] = {}
    for key, _, unit in MEASURES:
        row: dict[str, Any] = {}
        for system in SYSTEMS:
            values = [r[key][system] for r in rounds if system in r[key]]
            if not values:
                continue
            worst = min(values) if unit == "/s" else max(values)
            row[system] = {"p50": round(statistics.median(values), 3), "worst": round(worst, 3)}
        if "salt" in row and "ours" in row and row["salt"]["p50"] and row["ours"]["p50"]:
            salt, ours = row["salt"]["p50"], row["ours"]["p50"]
            row["ours_time_over_salt"] = round(salt / ours if unit == "/s" else ours / salt, 2)
        out[key] = row
    return out


def table(args: argparse.Namespace, sizes: dict[str, Any]) -> str:
    """Markdown: every size's measures, then the fleets' memory and idle CPU, then the
    commands that did not do what they should (none, in a run that counts)."""
    lines = [
        "| nodes | measure | Salt p50 | Salt worst | ours p50 | ours worst | our time ÷ Salt's |",
        "|---:|---|---:|---:|---:|---:|---:|",
    ]
    for nodes, size in sizes.items():
        for key, label, unit in MEASURES:
            row = size.get("summary", {}).get(key, {})
            if not row:
                continue
            name = label.format(C=args.commands, K=args.submitters)
            cells = [
                f"{row[s][q]:.2f} {unit}" if s in row else "-"
                for s in SYSTEMS
                for q in ("p50", "worst")
            ]
            ratio = row.get("ours_time_over_salt")
            lines.append(f"| {nodes} | {name} | {' | '.join(cells)} | {ratio or '-'} |")
    lines += [
        "",
        "| nodes | Salt: minions | Salt: master | ours: agents | ours: servers + Temporal hosts |",
        "|---:|---:|---:|---:|---:|",
    ]
    for nodes, size in sizes.items():
        if idle := size.get("idle"):
            rss, cpu = idle["rss_mib"], idle["idle_cpu_percent"]
            cells = [
                f"{rss[group]:.0f} MiB, {cpu[group]:.1f} % CPU"
                for group in ("minions", "master", "agents", "servers")
            ]
            lines.append(f"| {nodes} | {' | '.join(cells)} |")
    lines.append(f"\n(memory: RSS of the process trees; CPU: idle, over {args.idle:g} s)")
    failed = {
        f"{nodes} nodes, {what}": count
        for nodes, size in sizes.items()
        for what, count in size.get("failures", {}).items()
        if count
    }
    ours = {nodes: size["ours_checked"] for nodes, size in sizes.items() if "ours_checked" in size}
    if failed or any(not checked_ok(c) for c in ours.values()):
        lines.append(f"\n**Commands that failed** (the figures do not count): {failed} {ours}")
        for nodes, size in sizes.items():
            for what, problems in size.get("failed_commands", {}).items():
                lines += [f"- {nodes} nodes, {what}: {problem}" for problem in problems]
    return "\n".join(lines)


def checked_ok(checked: dict[str, Any]) -> bool:
    """Whether the rows say every job of ours did what it should."""
    return bool(
        checked["jobs"] == checked["jobs_expected"]
        and checked["states"] == {"succeeded": checked["jobs"]}
        and checked["all_jobs_short_of_nodes"] == 0
        and checked["one_node_jobs_without_one_success"] == 0
    )


def measure(bench: SideBySide) -> None:
    if not trio.run(wait_until_servers, bench.files, len(bench.servers)):
        raise Failed(f"not all {len(bench.servers)} servers were up")
    time.sleep(2.5)  # one more round of every edge's directory
    bench.token = create_token(bench.files, "bench.salt_side_by_side")
    log(f"salt-master on {MASTER}")
    bench.salt.start_master()
    for nodes in bench.args.nodes:
        bench.measure_size(nodes)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, nargs="+", default=[20], help="fleet sizes, ascending")
    parser.add_argument("--rounds", type=int, default=3, help="rounds at each size")
    parser.add_argument("--servers", type=int, default=3, help="our servers, 1 to 3")
    parser.add_argument("--commands", type=int, default=200, help="commands of the burst")
    parser.add_argument("--submitters", type=int, default=10, help="concurrent submitters")
    parser.add_argument("--idle", type=float, default=10.0, help="seconds of idle CPU taken")
    parser.add_argument("--salt-venv", type=Path, default=DEFAULT_VENV, help="Salt's own venv")
    parser.add_argument(
        "--fail", choices=SYSTEMS, help="that side runs a missing program: the run must stop"
    )
    parser.add_argument("--results-dir", type=Path, default=RESULTS_DIR, help="where the JSON goes")


def check(args: argparse.Namespace) -> str | None:
    if sorted(set(args.nodes)) != args.nodes or args.nodes[0] < 1:
        return "--nodes: sizes of 1 or more, ascending, each once"
    if not 1 <= args.servers <= len(SERVER_ADDRESSES):
        return f"--servers: 1 to {len(SERVER_ADDRESSES)}"
    if args.rounds < 1 or not 1 <= args.submitters <= args.commands:
        return "need --rounds >= 1 and 1 <= --submitters <= --commands"
    return None


def before_servers(bench: runner.Bench) -> None:
    """Salt installed (if it is not) before any server starts: a failed install costs none."""
    try:
        salt = ensure_venv(bench.args.salt_venv)
    except SaltFailed as e:
        raise Failed(str(e)) from None
    bench.out["versions"] = {"salt": salt, "orchestrator_zero": __version__}
    log(f"salt {salt}, orchestrator-zero {__version__}")


def run(bench: runner.Bench) -> None:
    salt = SaltFleet(bench.args.salt_venv, bench.root / "salt", MASTER)
    side = SideBySide(bench.args, bench.files, bench.servers, bench.root, bench.out, salt)
    bench.out["sizes"] = side.sizes
    bench.out["salt_master"] = MASTER
    bench.progress = side.progress
    # Undone last in, first out, each step whatever the others did, each within a bound;
    # then the runner stops our servers. A failure (Failed, at the first command that
    # failed or the first wait that ran out) reaches the runner, which says why and exits 1.
    with contextlib.ExitStack() as undo:
        undo.callback(write_results, bench)
        undo.callback(step, "stopping the agents", lambda: stop_all(side.agents))
        undo.callback(step, "stopping the salt-master and minions", salt.stop)
        undo.callback(step, "stopping the Salt API client", side.stop_salt_client)
        undo.callback(show_table, bench, side)
        measure(side)


def step(what: str, call: Callable[[], None]) -> None:
    """One step of the way out, logged with what it took (a slow one is seen)."""
    began = time.monotonic()
    log(f"{what}")
    call()
    log(f"{what}: done in {time.monotonic() - began:.1f} s")


def show_table(bench: runner.Bench, side: SideBySide) -> None:
    """The table as far as the run got, with the commands that failed, on stderr and in
    the document."""
    bench.out["table"] = table(bench.args, side.sizes)
    log("results:\n" + bench.out["table"])


def write_results(bench: runner.Bench, name: str = "salt-side-by-side") -> None:
    """The document as it is now, to --results-dir as NAME-SIZES-COMMIT-TIME.json (the
    runner prints it whole after)."""
    document = {**bench.out, "load_average_at_write": os.getloadavg()}
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    sizes = "-".join(str(n) for n in bench.args.nodes)
    commit = str(bench.out.get("source", "?")).split()[0]
    path = bench.args.results_dir / f"{name}-{sizes}-{commit}-{stamp}.json"
    bench.args.results_dir.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, default=str))
    log(f"wrote {path}")


SCENARIO = Scenario(
    "salt_side_by_side",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda args: SERVER_ADDRESSES[: args.servers],
    check=check,
    before_servers=before_servers,
    measured=("oz0", "cli", "oz0_node", "bench"),
)
