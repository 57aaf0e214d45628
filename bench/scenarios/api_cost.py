"""What one `node block` request costs the management API server (issue 13).

    python -m bench.api_cost [--nodes N] [--rounds R]
                             [--modes fresh,resume,keep,curl,go,go-keep]
                             [--address 127.0.0.X] [--py-spy OUT]

The runner (bench/runner.py) starts a fresh test cluster and one real server on 127.0.0.220
(or --address, so that two runs can go side by side); the nodes are N accepted nodes written
straight into the database (no streams: only the API is measured). For each mode, R rounds
of N concurrent requests from N threads of this process through cli.client.ApiClient: each
node blocked (`POST /api/v1/nodes/<id>/block`), then each unblocked. Modes: `fresh` a new
client per request (new connection, full TLS handshake, as separate CLI processes),
`resume` one client that never keeps a connection (a new connection per request that
resumes the TLS session), `keep` one client (its kept connections), `curl` one `curl
--parallel` per round of blocks and one of unblocks (a new connection and full TLS
handshake per request; also when each request's TLS handshake was done), `go` the same
from one `oz0-loadgen posts` (bench/loadgen/, built here) per round: a client that costs
the machine far less than curl does (1.0-1.2 ms of CPU a request against curl's 3-4 ms with
OpenSSL 3 here), and `go-keep` as `go` with `oz0-loadgen posts --keep`: each round's
connections opened and their handshakes done first, then the requests released together on
them (one each), as a client that keeps its connections (`keep`) at the generator's cost.
Its figures, per mode: the server's CPU per request (from /proc, the server's whole process,
over the whole mode: for `go-keep` each round's handshakes too, made in the round before
its release; only `keep` spreads them over the rounds), and the requests' latency (for
`go-keep` from the release: no handshake in it; `warm_s_max` the longest a round's
connections took to be made); for `curl`, `go` and `go-keep` also the
client's CPU per request (curl: its whole processes; go: the generator's from the requests'
release to the last answer, for `go-keep` without the handshakes, and
`client_process_cpu_ms_per_request` its whole processes, start, certificates and
handshakes included). With --py-spy, records the server with py-spy (`py-spy record
--format raw`) during the first mode into OUT.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from bench import curl, loadgen
from bench.measure import cpu_seconds, percentiles
from bench.runner import Bench, Scenario, log
from cli import client as client_module
from cli.client import ApiClient
from oz0.context import Context
from oz0_common.addresses import MANAGEMENT_PORT

ADDRESS = "127.0.0.220"
MODES = ("fresh", "resume", "keep", "curl", "go", "go-keep")
SETTLE = 3.0  # after start: the first membership and directory rounds
PY_SPY_START = 2.0
BODY = {"reason": "bench.api_cost"}


def curl_round(
    context: Context, address: str, ids: list[str], action: str
) -> list[tuple[float, float]]:
    """One `curl --parallel` requesting ACTION for every node of IDS at once; each request's
    (TLS handshake done, answer complete) in seconds from its start."""
    urls = [f"https://{address}:{MANAGEMENT_PORT}/api/v1/nodes/{i}/{action}" for i in ids]
    body = BODY if action == "block" else {}
    fields = curl.parallel_posts(
        context, urls, body, "%{time_appconnect} %{time_total}", max_time=60, fail=True
    )
    return [(float(tls), float(total)) for tls, total in fields]


def children_cpu_seconds() -> float:
    """CPU of this process's children that have ended (the curls)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def curl_mode(
    context: Context, address: str, ids: list[str], rounds: int, pid: int
) -> dict[str, Any]:
    timings: list[tuple[float, float]] = []
    cpu, began, client = cpu_seconds(pid), time.monotonic(), children_cpu_seconds()
    for _ in range(rounds):
        for action in ("block", "unblock"):
            timings += curl_round(context, address, ids, action)
    spent, wall = cpu_seconds(pid) - cpu, time.monotonic() - began
    client = children_cpu_seconds() - client
    return {
        "requests": len(timings),
        "wall_s": round(wall, 2),
        "server_cpu_ms_per_request": round(spent * 1000 / len(timings), 2),
        "server_cpu_pct_of_one_core": round(spent / wall * 100, 1),
        "curl_cpu_ms_per_request": round(client * 1000 / len(timings), 2),
        "latency_ms": percentiles([total for _, total in timings]),
        "tls_done_ms": percentiles([tls for tls, _ in timings]),
    }


def go_round(
    context: Context, address: str, ids: list[str], action: str, keep: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """One `oz0-loadgen posts` (KEEP: `--keep`) requesting ACTION for every node of IDS at
    once: each request's line and the generator's summary; any failed request raises."""
    urls = [f"https://{address}:{MANAGEMENT_PORT}/api/v1/nodes/{i}/{action}" for i in ids]
    body = BODY if action == "block" else {}
    answers, summary = loadgen.posts(
        context.ca_path, context.cert_path, context.key_path, urls, body, timeout=60, keep=keep
    )
    if summary["ok"] != len(urls):
        failed = [a for a in answers if not 200 <= a["status"] < 300]
        raise RuntimeError(f"{len(failed)} of {len(urls)} {action}s failed: {failed[:3]}")
    return answers, summary


def go_mode(
    context: Context, address: str, ids: list[str], rounds: int, pid: int, keep: bool
) -> dict[str, Any]:
    answers: list[dict[str, Any]] = []
    generator_cpu = 0.0
    warm: list[float] = []
    cpu, began, client = cpu_seconds(pid), time.monotonic(), children_cpu_seconds()
    for _ in range(rounds):
        for action in ("block", "unblock"):
            done, summary = go_round(context, address, ids, action, keep)
            answers += done
            generator_cpu += float(summary["cpu_s"])
            if keep:
                warm.append(float(summary["warm_s"]))
    spent, wall = cpu_seconds(pid) - cpu, time.monotonic() - began
    client = children_cpu_seconds() - client
    handshakes: dict[str, Any]
    if keep:
        # The handshakes were done before each round's release: not in the requests' times.
        handshakes = {"warm_s_max": max(warm)}
    else:
        handshakes = {"tls_done_ms": percentiles([a["tls_done"] - a["start"] for a in answers])}
    return {
        "requests": len(answers),
        "wall_s": round(wall, 2),
        "server_cpu_ms_per_request": round(spent * 1000 / len(answers), 2),
        "server_cpu_pct_of_one_core": round(spent / wall * 100, 1),
        "client_cpu_ms_per_request": round(generator_cpu * 1000 / len(answers), 2),
        "client_process_cpu_ms_per_request": round(client * 1000 / len(answers), 2),
        "latency_ms": percentiles([a["end"] - a["start"] for a in answers]),
        **handshakes,
    }


def one_mode(
    context: Context, address: str, ids: list[str], rounds: int, mode: str, pid: int
) -> dict[str, Any]:
    if mode == "curl":
        return curl_mode(context, address, ids, rounds, pid)
    if mode in ("go", "go-keep"):
        return go_mode(context, address, ids, rounds, pid, keep=mode == "go-keep")
    shared = ApiClient(context, learn_servers=False)
    keep_idle = client_module.KEEP_IDLE
    if mode == "resume":
        client_module.KEEP_IDLE = 0.0  # every connection closed after its answer
    latencies: list[float] = []

    def call(path: str, body: dict[str, Any]) -> None:
        client = ApiClient(context, learn_servers=False) if mode == "fresh" else shared
        began = time.monotonic()
        client.post(path, body)
        latencies.append(time.monotonic() - began)
        if client is not shared:
            client.close()

    try:
        cpu, began = cpu_seconds(pid), time.monotonic()
        with ThreadPoolExecutor(len(ids)) as pool:
            for _ in range(rounds):
                list(pool.map(lambda i: call(f"/api/v1/nodes/{i}/block", BODY), ids))
                list(pool.map(lambda i: call(f"/api/v1/nodes/{i}/unblock", {}), ids))
        spent, wall = cpu_seconds(pid) - cpu, time.monotonic() - began
    finally:
        client_module.KEEP_IDLE = keep_idle
        shared.close()
    requests = len(latencies)
    return {
        "requests": requests,
        "wall_s": round(wall, 2),
        "server_cpu_ms_per_request": round(spent * 1000 / requests, 2),
        "server_cpu_pct_of_one_core": round(spent / wall * 100, 1),
        "latency_ms": percentiles(latencies),
    }


def build_loadgen(bench: Bench) -> None:
    if {"go", "go-keep"} & set(bench.args.modes):
        loadgen.build()


def measure(bench: Bench) -> None:
    args, files, url, server, out = bench.args, bench.files, bench.url, bench.server, bench.out
    out["modes"] = {}
    with psycopg.connect(url.for_database(url.names.main), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO nodes (id, tenant, state, labels)"
            " SELECT 'node-' || lpad(to_hex(i), 12, '0'), 'default', 'accepted', %s"
            " FROM generate_series(1, %s) AS i",
            (Jsonb({"bench": "api_cost"}), args.nodes),
        )
    ids = [f"node-{i:012x}" for i in range(1, args.nodes + 1)]
    context = Context.load(files.context_path)
    time.sleep(SETTLE)
    for i, mode in enumerate(args.modes):
        spy = None
        if args.py_spy and i == 0:
            spy = subprocess.Popen(
                [
                    *("py-spy", "record", "-p", str(server.pid), "-r", "250", "--threads"),
                    *("-f", "raw", "-o", str(args.py_spy), "--nonblocking"),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(PY_SPY_START)
        out["modes"][mode] = one_mode(context, args.address, ids, args.rounds, mode, server.pid)
        if spy is not None:
            spy.send_signal(2)
            spy.wait(30)
        log(f"{mode}: {json.dumps(out['modes'][mode])}")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=50, help="concurrent requests")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument(
        "--address", default=ADDRESS, help=f"the server's loopback address (default {ADDRESS})"
    )
    parser.add_argument("--py-spy", type=Path, help="record the server during the first mode")


def check(args: argparse.Namespace) -> str | None:
    if any(m not in MODES for m in args.modes):
        return f"--modes: a comma-separated list of {', '.join(MODES)}"
    return None


SCENARIO = Scenario(
    "api_cost",
    __doc__ or "",
    arguments,
    run_blocking=measure,
    servers=lambda args: (args.address,),
    check=check,
    before_servers=build_loadgen,
)
