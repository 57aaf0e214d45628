"""Bursts of blocks (issue 13): concurrent `node block` requests through one server's API,
request to stream refused, with many nodes streaming to three servers.

    python -m bench.block_burst [--nodes N] [--burst K] [--rounds R] [--multi M]
                                [--modes cli,kept] [--seed SEED] [--server-logs DIR]

Starts a fresh test cluster (the suite's PostgreSQL) and three real servers on 127.0.0.220,
.221 and .222 (default ports), then from this one process:

1. joins N nodes through `/join` and keeps a control stream up for each, node i on edge
   i % 3: bench.node_removal's simulated nodes (the agent's heartbeats and reconnect
   policy), the generator of issues 4 and 5;
2. for each mode, R rounds of K concurrent single blocks (`POST /api/v1/nodes/<id>/block`,
   what `orchestrator-zero node block ID` sends) through 127.0.0.220's API, of nodes
   spread over the three servers, from an operator process of its own (cli.client, K
   threads), each round once the last one's streams were all refused. Modes: `cli` makes
   a new client per request (a new connection with a full TLS handshake, as K separate
   CLI processes would), `kept` shares one client (its kept connections and resumed TLS
   sessions, as one long-lived API client would);
3. one block of M nodes in one request (`POST /api/v1/nodes/block` with their IDs, what
   `node block ID ID ...` sends);
4. for each: from just before the request to the node's stream receiving `refused` code
   `blocked` (p50/p99, split by whether the node streams to the API's server), the API
   call's time, and the API server's CPU per request (its CPU during the phase less what
   its streams cost it, measured for 10 s before the first phase); then stops everything
   and prints one JSON document. This process's loop lag is in each phase: under load it
   delays the time stamps of `refused`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio
from cryptography.hazmat.primitives.asymmetric import ec

from bench.edge_load import (
    CLOSE_TIMEOUT,
    SERVER_START_TIMEOUT,
    Heartbeats,
    Streams,
    cpu_seconds,
    create_token,
    failure_text,
    log,
    loop_lag,
    machine_info,
    on_terminate_signal,
    percentiles,
    source_version,
    watch_server,
    watch_signals,
)
from bench.node_removal import (
    Api,
    Call,
    Change,
    Fleet,
    Run,
    SimNode,
    all_done,
    block_seen,
    by_edge,
    lost_and_failed,
    server_log,
    wait_until,
    wait_until_servers,
)
from cli.client import ApiClient
from fixtures import edge_client
from fixtures.cluster import ClusterFiles, ServerProcess, initialise
from fixtures.postgres import fresh_database_url
from oz0 import pki
from oz0.context import MANAGEMENT_PORT, Context

ADDRESSES = ("127.0.0.220", "127.0.0.221", "127.0.0.222")
EDGES = [f"{address}:7443" for address in ADDRESSES]
API_SERVER = f"{ADDRESSES[0]}:{MANAGEMENT_PORT}"
TARGET_P99 = 0.2  # issue 13: request to refused, 50 concurrent blocks
DOCUMENTED = 2.0  # docs/manage-nodes.md
BURST_WAIT = 15.0
PHASE_LIMIT = 600.0
MODES = ("cli", "kept")
IDLE_WINDOW = 10.0


def operator_process(context_path: str, server: str, concurrency: str, mode: str) -> None:
    """bench.node_removal's operator process, with a MODE: `cli`, a new client (connection,
    full TLS handshake) per request; `kept`, one client for all of them. A line with `ids`
    is one multi-ID block."""
    context = dataclasses.replace(Context.load(Path(context_path)), servers=(server,))
    shared = ApiClient(context, learn_servers=False)
    printing = threading.Lock()

    def call(request: dict[str, Any]) -> None:
        client = ApiClient(context, learn_servers=False) if mode == "cli" else shared
        requested = time.monotonic()
        error = None
        try:
            client.post(request["path"], request["body"])
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[:200]
        done = {"id": request["id"], "requested": requested, "answered": time.monotonic()}
        if client is not shared:
            client.close()
        with printing:
            print(json.dumps({**done, "error": error}), flush=True)

    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(int(concurrency)) as pool:
        for line in sys.stdin:
            pool.submit(call, json.loads(line))
    shared.close()


def on_api_server(change: Change) -> bool:
    return change.edge is not None and change.edge.startswith(f"{ADDRESSES[0]}:")


def summary(changes: list[Change]) -> dict[str, Any]:
    """Request to refused, and the API call, for CHANGES (all sent)."""
    to_refused, api, errors, missing = [], [], Counter[str](), []
    for change in changes:
        call = change.call
        if call is None:
            errors["not sent"] += 1
            continue
        api.append(call.answered - call.requested)
        if call.error is not None:
            errors[call.error.split(":")[0]] += 1
            continue
        seen = block_seen(change)
        if seen is None:
            missing.append(change.node.node_id)
            continue
        to_refused.append(seen - call.requested)
    return {
        "n": len(changes),
        "refused": len(to_refused),
        "not_refused": missing[:10],
        "api_errors": dict(errors),
        "request_to_refused_ms": percentiles(to_refused),
        "api_call_ms": percentiles(api),
        f"over_{DOCUMENTED:g}s": sum(t > DOCUMENTED for t in to_refused),
    }


def split(changes: list[Change]) -> dict[str, Any]:
    return {
        "all": summary(changes),
        "node_on_api_server": summary([c for c in changes if on_api_server(c)]),
        "node_on_other_servers": summary([c for c in changes if not on_api_server(c)]),
    }


@dataclass(eq=False)
class Burst:
    """The phases of one run, on top of bench.node_removal's Run (joins, ramp, meter)."""

    run: Run
    api_pid: int
    # The API server's CPU seconds per second with streams only (their heartbeats).
    idle_cpu: float = 0.0

    async def measure_idle(self, seconds: float = IDLE_WINDOW) -> None:
        cpu, began = cpu_seconds(self.api_pid), time.monotonic()
        await trio.sleep(seconds)
        self.idle_cpu = (cpu_seconds(self.api_pid) - cpu) / (time.monotonic() - began)
        self.run.out["api_server_idle_cpu_pct"] = round(self.idle_cpu * 100, 1)

    async def measured(
        self, name: str, requests: int, work: Callable[[], Awaitable[dict[str, Any]]]
    ) -> dict[str, Any]:
        """WORK's section, with the API server's CPU per request: its CPU during the phase
        less what its streams cost meanwhile (IDLE_CPU)."""
        self.run.begin(name)
        cpu, began = cpu_seconds(self.api_pid), time.monotonic()
        with trio.move_on_after(PHASE_LIMIT) as bounded:
            section = await work()
        spent = cpu_seconds(self.api_pid) - cpu - self.idle_cpu * (time.monotonic() - began)
        section["api_server_cpu_ms_per_request"] = round(spent * 1000 / max(requests, 1), 2)
        section["timed_out"] = bounded.cancelled_caught
        self.run.end(name, section)
        ended: dict[str, Any] = self.run.phases[name]
        return ended

    async def singles(
        self, api: Api, mode: str, nodes: list[SimNode], burst: int
    ) -> dict[str, Any]:
        """Bursts of BURST concurrent single-node blocks, each once the last one's streams
        were refused (or BURST_WAIT passed)."""
        changes = [Change(n, f"bursts of {burst}", n.edge) for n in nodes]

        async def one(change: Change) -> None:
            path = f"/api/v1/nodes/{change.node.node_id}/block"
            change.call = await api.post(path, {"reason": "bench.block_burst"})

        async def work() -> dict[str, Any]:
            rounds = []
            for start in range(0, len(changes), burst):
                group = changes[start : start + burst]
                began = time.monotonic()
                async with trio.open_nursery() as nursery:
                    for change in group:
                        nursery.start_soon(one, change)
                answered = time.monotonic() - began
                await wait_until(partial(all_done, group, block_seen), BURST_WAIT)
                rounds.append([round(answered, 2), round(time.monotonic() - began, 2)])
            return {**split(changes), "rounds_answered_and_refused_s": rounds}

        return await self.measured(f"singles_{mode}", len(changes), work)

    async def multi(self, api: Api, nodes: list[SimNode]) -> dict[str, Any]:
        """One request blocking every node of NODES; each node's time from that request."""
        changes = [Change(n, "one request", n.edge) for n in nodes]

        async def work() -> dict[str, Any]:
            ids = [c.node.node_id for c in changes]
            # Wall clock, to set against the servers' log lines (`ending its stream`).
            requested_utc = dt.datetime.now(dt.UTC).isoformat()
            call: Call = await api.post("/api/v1/nodes/block", {"ids": ids, "reason": "bench"})
            for change in changes:
                change.call = call
            await wait_until(partial(all_done, changes, block_seen), BURST_WAIT)
            return {**split(changes), "requested_utc": requested_utc}

        return await self.measured(f"multi_{len(nodes)}", 1, work)


async def measure(run: Run, args: argparse.Namespace) -> None:
    run.phase[0] = "servers up"
    if not await wait_until_servers(run.files, len(run.servers)):
        raise RuntimeError("not all servers were up")
    await trio.sleep(2.5)  # one more round of every edge's directory
    ca_pem, ca_hash = await edge_client.fetch_ca(EDGES[0])
    if ca_hash != run.files.ca_hash:
        raise RuntimeError(f"edge presents CA {ca_hash}, cluster has {run.files.ca_hash}")
    ca_key = pki.cert_from_pem(ca_pem).public_key()
    assert isinstance(ca_key, ec.EllipticCurvePublicKey)
    token = await trio.to_thread.run_sync(create_token, run.files, "bench.block_burst")
    fleet = Fleet([], Streams(), ca_key, run.files.name, run.rng)
    await run.join(fleet, token, ca_pem)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(Heartbeats(fleet.streams, nursery).run)
        await run.ramp(fleet, nursery)
        fleet.streams.measuring = True
        chosen = by_edge(fleet.nodes, run.rng, EDGES)
        per_mode = args.burst * args.rounds
        needed = per_mode * len(args.modes) + args.multi
        if len(chosen) < needed:
            raise RuntimeError(f"only {len(chosen)} nodes streaming, {needed} needed")
        api_pid = run.servers[ADDRESSES[0]].pid
        burst = Burst(run, api_pid)
        await burst.measure_idle()
        for i, mode in enumerate(args.modes):
            async with Api.running(
                run.files, API_SERVER, args.burst, module="bench.block_burst", extra=(mode,)
            ) as api:
                run.meter.others["operator"] = api.process.pid
                await burst.singles(
                    api, mode, chosen[i * per_mode : (i + 1) * per_mode], args.burst
                )
                if i == len(args.modes) - 1 and args.multi:
                    start = len(args.modes) * per_mode
                    await burst.multi(api, chosen[start : start + args.multi])
        run.phase[0] = "end"
        run.out["end"] = {"streams_open": fleet.streams.open, **lost_and_failed(fleet.nodes)}
        fleet.streams.stop()
        with trio.move_on_after(CLOSE_TIMEOUT):
            await fleet.streams.all_closed.wait()
        nursery.cancel_scope.cancel()
    run.out["targets"] = {
        name: {
            "p99_ms": section["all"]["request_to_refused_ms"]["p99"],
            "under_200ms": (section["all"]["request_to_refused_ms"]["p99"] or 1e9)
            < TARGET_P99 * 1000,
        }
        for name, section in run.phases.items()
        if name.startswith(("singles_", "multi_"))
    }
    run.phase[0] = "done"


async def run_bench(
    args: argparse.Namespace,
    files: ClusterFiles,
    servers: dict[str, ServerProcess],
    root: Path,
    out: dict[str, Any],
) -> None:
    run = Run(args, files, servers, [], root, out)
    run.edges = list(EDGES)
    async with trio.open_nursery() as watchdog:
        for server in servers.values():
            watchdog.start_soon(watch_server, server, run.phase)
        watchdog.start_soon(watch_signals)
        watchdog.start_soon(loop_lag, run.meter.lag, trio.Event())
        await measure(run, args)
        watchdog.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--burst", type=int, default=50, help="concurrent single blocks")
    parser.add_argument("--rounds", type=int, default=3, help="bursts per mode")
    parser.add_argument("--multi", type=int, default=50, help="nodes of the one multi-ID block")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=list(MODES))
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--server-logs", type=Path, help="keep the servers' stderr in DIR")
    parser.add_argument("--operator", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.operator:
        operator_process(*args.operator)
        return
    if any(m not in MODES for m in args.modes):
        parser.error(f"--modes: a comma-separated list of {', '.join(MODES)}")
    out: dict[str, Any] = {
        "command": " ".join(["python -m bench.block_burst", *sys.argv[1:]]),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": machine_info(),
        "servers": list(ADDRESSES),
        "api_server": API_SERVER,
        "source": source_version(("oz0", "cli", "oz0_node")),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    failure: BaseException | None = None
    signal.signal(signal.SIGTERM, on_terminate_signal)
    signal.signal(signal.SIGHUP, on_terminate_signal)
    with tempfile.TemporaryDirectory() as tmp, fresh_database_url() as url:
        root = Path(tmp)
        files = initialise(root, url, "bench", advertise=ADDRESSES[0])
        servers = {a: ServerProcess.for_cluster(files, a, workdir=root / a) for a in ADDRESSES}
        try:
            for address, server in servers.items():
                server.start(timeout=SERVER_START_TIMEOUT)
                log(f"server up on {address}")
            trio.run(run_bench, args, files, servers, root, out)
        except BaseException as e:
            failure = e
            out["failed"] = failure_text(e)
            log(f"failed: {out['failed']}")
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            signal.signal(signal.SIGHUP, signal.SIG_IGN)
            out["server_logs"] = {}
            for address, server in servers.items():
                with contextlib.suppress(Exception):
                    server.kill()
                text = server.stderr()
                out["server_logs"][address] = server_log(text, [None, None])
                if args.server_logs:
                    args.server_logs.mkdir(parents=True, exist_ok=True)
                    (args.server_logs / f"{address}.log").write_text(text)
    print(json.dumps(out, indent=2))
    if failure is not None and not isinstance(failure, Exception):
        raise failure


if __name__ == "__main__":
    main()
