"""Salt driven through its Python API (salt.client.LocalClient), for
bench.salt_side_by_side: run by the Salt venv's Python, so it imports Salt and the standard
library only, never this project.

    SALT_VENV/bin/python -P bench/salt_client.py CONFIG_DIR

One request a line on stdin, one answer a line on stdout (JSON); one LocalClient, made once,
as a program that drives Salt keeps one:

    {"op": "cmd", "target": "*", "program": "true"}
        -> {"wall": S, "returned": K}: `cmd.run PROGRAM` (default `true`) on TARGET, until
           every minion returned; K minions did with exit code 0 and no output.
    {"op": "burst", "targets": [[T, ...], ...]}
        -> {"wall": S, "returned": K, "errors": [...]}: one process a list (each with its
           own LocalClient, made before the clock starts), each running `cmd.run true` on
           its targets one after the other; from the first start to the last end.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import sys
import time
from typing import Any

# The whole fleet answers within this (Salt's CLI default is 5 s and more for a slow one).
RETURN_TIMEOUT = 120
BARRIER_TIMEOUT = 120.0


def local_client(config_dir: str) -> Any:
    client = importlib.import_module("salt.client")
    return client.LocalClient(c_path=f"{config_dir}/master")


def run_true(client: Any, target: str, program: str = "true") -> int:
    """`cmd.run PROGRAM` on TARGET (a minion ID or a glob); how many returned exit code 0
    and no output."""
    answers = client.cmd(target, "cmd.run", [program], timeout=RETURN_TIMEOUT, full_return=True)
    return sum(
        isinstance(a, dict) and a.get("retcode") == 0 and a.get("ret") == ""
        for a in answers.values()
    )


def _burst_worker(
    config_dir: str,
    targets: list[str],
    ready: Any,
    results: Any,
) -> None:
    client = local_client(config_dir)
    ready.wait(BARRIER_TIMEOUT)
    began = time.time()
    returned = 0
    errors = []
    for target in targets:
        try:
            returned += run_true(client, target)
        except Exception as e:  # reported, not raised: the burst's other workers go on
            errors.append(f"{target}: {type(e).__name__}: {e}"[:300])
    results.put({"began": began, "ended": time.time(), "returned": returned, "errors": errors})


def burst(config_dir: str, lists: list[list[str]]) -> dict[str, Any]:
    # Spawned, not forked: a fork would copy this process's Salt client, its ZeroMQ
    # sockets and event loop with it, none of which survives a fork.
    context = multiprocessing.get_context("spawn")
    ready = context.Barrier(len(lists) + 1)
    results = context.Queue()
    workers = [
        context.Process(target=_burst_worker, args=(config_dir, targets, ready, results))
        for targets in lists
    ]
    for worker in workers:
        worker.start()
    ready.wait(BARRIER_TIMEOUT)
    done = [results.get(timeout=RETURN_TIMEOUT * 10) for _ in workers]
    for worker in workers:
        worker.join(BARRIER_TIMEOUT)
    return {
        "wall": max(d["ended"] for d in done) - min(d["began"] for d in done),
        "returned": sum(d["returned"] for d in done),
        "errors": [e for d in done for e in d["errors"]][:10],
    }


def main() -> None:
    config_dir = sys.argv[1]
    client = local_client(config_dir)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        answer: dict[str, Any]
        if request["op"] == "cmd":
            began = time.perf_counter()
            returned = run_true(client, request["target"], request.get("program", "true"))
            answer = {"wall": time.perf_counter() - began, "returned": returned}
        elif request["op"] == "burst":
            answer = burst(config_dir, request["targets"])
        else:
            answer = {"error": f"unknown op {request['op']!r}"}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
