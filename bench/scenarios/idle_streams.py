"""Idle control streams held by the Go load generator: what they cost a server, and it.

    python -m bench.idle_streams [--nodes N] [--idle SECONDS] [--join-concurrency C]
                                 [--ramp-batch B] [--server-logs DIR] [--heap-profile PATH]
                                 [--gomaxprocs N]

The runner (bench/runner.py) starts a fresh test cluster and ONE real server on 127.0.0.223
(as for bench.edge_load on .41); then, with `oz0-loadgen` (bench/loadgen/): joins N nodes
with a token, C at a time (joins per second, latency); holds their N control streams, B
opened at a time; once all
are up, keeps them idle for SECONDS and measures the server's and the generator's RSS and
CPU, the server's membership heartbeat age, streams alive and the longest heartbeat gap.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import trio

from bench import loadgen
from bench.measure import CpuWindow, database_view, rss_mib, sample_membership
from bench.runner import Bench, Scenario, create_token, log
from fixtures.cluster import ClusterFiles, ServerProcess
from oz0 import context
from oz0_common.addresses import EDGE_PORT

ADDRESS = "127.0.0.223"
EDGE = f"{ADDRESS}:{EDGE_PORT}"
# All streams up within this, or the run says so and measures what is up.
RAMP_TIMEOUT = 600.0
RAMP_STALLED = 60.0


async def run(bench: Bench) -> None:
    await measure(bench.args, bench.files, bench.server, bench.out, bench.root)


async def measure(
    args: argparse.Namespace,
    files: ClusterFiles,
    server: ServerProcess,
    out: dict[str, Any],
    workdir: Path,
) -> None:
    ca_file = files.context_dir / context.CA_FILE
    token = await trio.to_thread.run_sync(create_token, files, "bench.idle_streams")
    nodes_dir = workdir / "nodes"
    ours: dict[str, int | str] = {"server": server.pid}
    cpu = CpuWindow(ours).start()
    out["join"] = await loadgen.join(
        EDGE, ca_file, token, nodes_dir, nodes=args.nodes, concurrency=args.join_concurrency
    )
    out["join"]["server_cpu_pct"] = cpu.stop()["server"]
    log(f"joins: {json.dumps(out['join'])}")
    joined = int(out["join"]["joined"])

    await trio.sleep(2)  # let the join burst settle before the baseline
    server_rss_before = rss_mib(server.pid)
    extra = ["--quiet-events", "--stats-every", "5", "--ramp-batch", str(args.ramp_batch)]
    # Each node from an address of its own, as distinct machines: the edge admits 64
    # unauthenticated connections per address, and a ramp has more in flight.
    extra += ["--source-per-node", "127.5"]
    if args.heap_profile:
        extra += ["--heap-profile", str(args.heap_profile)]
    env = {"GOMAXPROCS": str(args.gomaxprocs)} if args.gomaxprocs else {}
    async with loadgen.hold([EDGE], ca_file, nodes_dir, extra=extra, env=env) as held:
        ours["generator"] = held.process.pid
        began = time.monotonic()
        cpu = CpuWindow(ours).start()
        latest: dict[str, Any] = {}
        best, grew = 0, time.monotonic()
        with trio.move_on_after(RAMP_TIMEOUT):
            async for event in held:
                latest = event
                log(f"ramp: {event['streams_alive']} alive, {event['connecting']} connecting")
                if event["streams_alive"] >= joined:
                    break
                if event["streams_alive"] > best:
                    best, grew = event["streams_alive"], time.monotonic()
                elif time.monotonic() - grew > RAMP_STALLED:
                    log(f"ramp: no more streams up in {RAMP_STALLED} s; measuring what is up")
                    break
        out["ramp"] = {
            "s": round(time.monotonic() - began, 1),
            "welcomed": latest.get("welcomed_total"),
            "reconnects": latest.get("reconnects"),
            "alive": latest.get("streams_alive"),
            "failed": latest.get("failed"),
            "cpu_pct": cpu.stop(),
        }
        log(f"ramp: {json.dumps(out['ramp'])}")

        ages: list[float] = []
        sampled = trio.Event()
        window = CpuWindow(ours).start()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample_membership, files, ages, sampled)
            with trio.move_on_after(args.idle):
                async for event in held:
                    latest = event
            sampled.set()
        used = window.stop()
        db = await trio.to_thread.run_sync(database_view, files)
        out["idle"] = {
            "seconds": args.idle,
            "streams_alive_at_end": latest.get("streams_alive"),
            "nodes_connected_in_db": db["connected"],
            "ended_during_run": latest.get("ended"),
            "longest_heartbeat_gap_s": latest.get("max_gap_s"),
            "server_rss_before_streams_mib": server_rss_before,
            "server_rss_mib": rss_mib(server.pid),
            "server_cpu_pct_of_one_core": used["server"],
            "generator_rss_mib": rss_mib(held.process.pid),
            "generator_cpu_pct_of_one_core": used["generator"],
            "machine_cpu_pct": used["machine"],
            "other_processes_cpu_pct": used["others"],
            "server_membership_heartbeat_age_s": {
                "samples": len(ages),
                "over_2s": sum(a > 2.0 for a in ages),
                "max": round(max(ages, default=0.0), 1),
            },
        }
        log(f"idle: {json.dumps(out['idle'])}")
        out["generator_summary"] = await held.stop()


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--join-concurrency", type=int, default=32)
    parser.add_argument("--ramp-batch", type=int, default=50)
    parser.add_argument("--heap-profile", type=Path, help="the generator's heap profile (pprof)")
    parser.add_argument("--gomaxprocs", type=int, help="GOMAXPROCS of the generator")


def build_loadgen(_bench: Bench) -> None:
    loadgen.build()


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 1 or args.join_concurrency < 1 or args.ramp_batch < 1 or args.idle < 0:
        return "--nodes, --join-concurrency and --ramp-batch must be positive"
    return None


SCENARIO = Scenario(
    "idle_streams",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: (ADDRESS,),
    check=check,
    before_servers=build_loadgen,
)
