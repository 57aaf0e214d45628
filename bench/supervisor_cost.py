"""What one attempt's supervisor costs on the node (issue 31): CPU and wall time of
`supervisor_client.launch` for `true`, with the isolation the agent uses by default.

    python -m bench.supervisor_cost [--attempts N] [--parallel K] [--no-launcher]
        [--against-job-user NAME] [--unisolated]

Launches N attempts of `true` (K at a time, each from a thread of its own, as the agent's
manager does), each under a fresh supervisor, and prints one JSON object:

- `cpu_s_per_attempt`: user + system CPU of everything an attempt ran outside this process
  (the supervisor's first process, the supervisor, the launcher's share and `true`), from
  getrusage of this process's children: this process is a child subreaper, so the
  supervisors come back to it and are reaped here (their rusage includes `true`'s). The
  launcher (a child that lives across attempts) is counted from /proc at the end;
- `agent_cpu_s_per_attempt`: CPU of this process (the agent's side: the launching thread);
- `launch_to_ready_ms` p50 / p99: `launch` called → it returned (the command has started);
- `launch_to_status_ms` p50 / p99: `launch` called → DIR/status.json written.

`--against-job-user NAME` (root; one at a time): attempts alternate between the default
isolation (each its own UID, its own /tmp, swept after) and one that runs them all as the
account NAME, so that both meet the same machine; `against` has the account's figures and
`own_uid_adds_ms` the differences of the p50s (what the own UID's claim, namespace and sweep
add), the CPU figures are then of both together.

`--unisolated`: the same supervisor, but the command runs as this process's user with no
cgroup, no limits and no job user (as attempts ran before issue 29): the baseline that
isolation's cost is measured against.

Self-contained: it starts no server. Runs as root (each attempt its own UID, swept after;
cgroups) or as a user (the attempts run as that user). Progress and the setup go to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import resource
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from oz0_node.jobs import procfs
from oz0_node.jobs.attempt_files import SupervisedSpec
from oz0_node.jobs.isolation import Isolation, Limits
from oz0_node.jobs.job_user import JobUser
from oz0_node.jobs.launcher import Launcher
from oz0_node.jobs.supervisor_client import Supervised, launch, stop_all
from oz0_node.jobs.tracking import PROCESS_GROUP

PR_SET_CHILD_SUBREAPER = 36
NODE_ID = "node-5c0e0000b0b0"
STATUS_WITHIN = 30.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _cpu(usage: resource.struct_rusage) -> float:
    return usage.ru_utime + usage.ru_stime


def _process_cpu(pid: int) -> float:
    """utime + stime of PID (not its children), from /proc/PID/stat; 0 once it is gone."""
    try:
        text = (procfs.PROC / str(pid) / "stat").read_bytes()
    except OSError:
        return 0.0
    fields = text[text.rfind(b")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def _reap_until(pids: set[int], deadline: float) -> None:
    """Reap the supervisors (they come back to this subreaper), as their rusage counts."""
    while pids and time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            time.sleep(0.005)
        pids.discard(pid)


def _one(
    data_dir: Path,
    isolation: Isolation,
    launcher: Launcher | None,
    n: int,
    ready_ms: list[float],
    status_ms: list[float],
) -> int:
    spec = SupervisedSpec(
        node_id=NODE_ID,
        job_id="job-00000000c057",
        attempt=n,
        command=("true",),
        env={},
        timeout=None,
        limits=Limits(),
    )
    start = time.perf_counter()
    supervised = launch(data_dir, spec, isolation, launcher)
    ready_ms.append((time.perf_counter() - start) * 1000)
    pid = int(json.loads((supervised.dir / "supervisor.json").read_text())["pid"])
    _wait_status(supervised)
    status_ms.append((time.perf_counter() - start) * 1000)
    return pid


def _wait_status(supervised: Supervised) -> None:
    deadline = time.monotonic() + STATUS_WITHIN
    while supervised.status() is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"{supervised.dir.name}: no status in {STATUS_WITHIN} s")
        time.sleep(0.001)


def measure(
    attempts: int,
    parallel: int,
    use_launcher: bool,
    against: str | None = None,
    isolated: bool = True,
) -> dict[str, Any]:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise SystemExit("cannot become a child subreaper")
    with tempfile.TemporaryDirectory(prefix="oz0-supervisor-cost-") as raw:
        data_dir = Path(raw)
        isolation = (
            Isolation.detect(data_dir, supervised=True)
            if isolated
            else Isolation(data_dir, JobUser.of_agent(), drop=False, tracking=PROCESS_GROUP)
        )
        # As the agent's start does: each attempt's own UID needs its claims' directory.
        isolation.prepare_uids()
        print(f"isolation: {isolation.describe(NODE_ID)}", file=sys.stderr)
        named = Isolation.detect(data_dir, against, supervised=True) if against else None
        named_ready: list[float] = []
        named_status: list[float] = []
        started = Launcher() if use_launcher else None
        if started is not None:
            started.start()
        try:
            # One attempt to warm the page cache (and the launcher), not counted.
            pid = _one(data_dir, isolation, started, 1, [], [])
            _reap_until({pid}, time.monotonic() + STATUS_WITHIN)
            ready_ms: list[float] = []
            status_ms: list[float] = []
            launcher_pid = started.pid if started is not None else None
            launcher_before = _process_cpu(launcher_pid) if launcher_pid is not None else 0.0
            children = resource.getrusage(resource.RUSAGE_CHILDREN)
            me = resource.getrusage(resource.RUSAGE_SELF)
            wall = time.perf_counter()
            n = 2
            while n < attempts + 2:
                batch = range(n, min(n + parallel, attempts + 2))
                pids: list[int] = []

                def one(k: int, pids: list[int] = pids) -> None:
                    if named is not None and k % 2:
                        pids.append(_one(data_dir, named, started, k, named_ready, named_status))
                    else:
                        pids.append(_one(data_dir, isolation, started, k, ready_ms, status_ms))

                threads = [threading.Thread(target=one, args=(k,)) for k in batch]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join()
                _reap_until(set(pids), time.monotonic() + STATUS_WITHIN)
                n += len(batch)
            wall = time.perf_counter() - wall
            launcher_cpu = (
                _process_cpu(launcher_pid) - launcher_before if launcher_pid is not None else 0.0
            )
            children_cpu = _cpu(resource.getrusage(resource.RUSAGE_CHILDREN)) - _cpu(children)
            agent_cpu = _cpu(resource.getrusage(resource.RUSAGE_SELF)) - _cpu(me)
        finally:
            if started is not None:
                started.stop()
            stop_all(data_dir, 5.0)
    compared: dict[str, Any] = {}
    if named is not None:
        compared["against"] = {
            "isolation": named.describe(NODE_ID),
            "attempts": len(named_ready),
            "launch_to_ready_ms": _figures(named_ready),
            "launch_to_status_ms": _figures(named_status),
        }
        compared["own_uid_adds_ms"] = {
            "ready_p50": round(statistics.median(ready_ms) - statistics.median(named_ready), 1),
            "status_p50": round(statistics.median(status_ms) - statistics.median(named_status), 1),
        }
    return {
        "benchmark": "supervisor_cost",
        "attempts": attempts,
        "parallel": parallel,
        "launcher": use_launcher,
        "isolation": isolation.describe(NODE_ID),
        "cpu_s_per_attempt": round((children_cpu + launcher_cpu) / attempts, 4),
        "launcher_cpu_s_per_attempt": round(launcher_cpu / attempts, 4),
        "agent_cpu_s_per_attempt": round(agent_cpu / attempts, 4),
        "launch_to_ready_ms": _figures(ready_ms),
        "launch_to_status_ms": _figures(status_ms),
        "attempts_per_s": round(attempts / wall, 1),
        "load_average": [round(v, 2) for v in os.getloadavg()],
        **compared,
    }


def _figures(values: list[float]) -> dict[str, float]:
    return {
        "p50": round(statistics.median(values), 1),
        "p99": round(_percentile(values, 0.99), 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=50)
    parser.add_argument("--parallel", type=int, default=1, help="attempts launched at once")
    parser.add_argument(
        "--unisolated",
        action="store_true",
        help="no job user, cgroup or limits: the baseline isolation is measured against",
    )
    parser.add_argument(
        "--no-launcher",
        action="store_true",
        help="a fresh interpreter per attempt (launch's fallback), not the launcher's fork",
    )
    parser.add_argument(
        "--against-job-user",
        metavar="NAME",
        help="every other attempt as the account NAME: what the own UID adds, side by side",
    )
    options = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        result = measure(
            options.attempts,
            max(1, options.parallel),
            not options.no_launcher,
            options.against_job_user,
            isolated=not options.unisolated,
        )
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
