"""Edge load: joins per second, and what thousands of idle control streams cost a server.

    python -m bench.edge_load [--nodes N] [--idle SECONDS] [--join-concurrency C]
                              [--ramp-batch B] [--server-logs DIR] [--no-gc-freeze]
                              [--address IP]

The runner (bench/runner.py) starts a fresh test cluster and ONE real server on 127.0.0.41
(or --address); then, from this one process (the simulated nodes of fixtures/edge_client.py):

1. creates a join token (tenant default, unlimited uses, no expiry) through the data layer;
2. makes N P-256 keys and certificate requests (not timed), then joins the N nodes through
   the edge's `/join` with that token, C at a time: wall time, joins per second, latency;
3. opens N control streams with each node's own certificate, in batches of B, each read by
   a Trio task of its own; one task sends every stream's heartbeat every 5 s and ends a
   stream that heard nothing for three (docs/node-protocol.md);
4. keeps them idle for SECONDS and measures the RSS and CPU of the server process (and of
   this process), heartbeat gaps, and how many streams are still alive at the end;
5. closes the streams.

Every phase has a time bound, so it ends by itself whatever the server does. This
process's long-lived objects are frozen out of garbage collection (gc.freeze) so that
full collections do not stall its event loop; --no-gc-freeze turns that off.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import time
from typing import Any

import trio

from bench.measure import (
    CpuWindow,
    GcPauses,
    database_view,
    loop_lag,
    percentiles,
    rss_mib,
    sample_membership,
)
from bench.runner import Bench, Scenario, create_token, log
from fixtures import edge_client
from fixtures.edge_client import (
    HEARTBEAT,
    Heartbeats,
    Node,
    NodeKeys,
    Streams,
    control_stream,
    join_all,
)
from oz0 import pki

ADDRESS = "127.0.0.41"
CLOSE_TIMEOUT = 60.0
BATCH_TIMEOUT = 150.0


async def run(bench: Bench) -> None:
    streams = Streams()
    bench.progress = streams.snapshot
    gc_pauses = GcPauses()
    gc.callbacks.append(gc_pauses.callback)
    try:
        await measure(bench, streams, gc_pauses)
    finally:
        gc.callbacks.remove(gc_pauses.callback)


async def measure(bench: Bench, streams: Streams, gc_pauses: GcPauses) -> None:
    args, files, server, out, phase = bench.args, bench.files, bench.server, bench.out, bench.phase
    edge = bench.edges[0]
    n = args.nodes
    ca_pem, ca_hash = await edge_client.fetch_ca(edge)
    if ca_hash != files.ca_hash or pki.ca_hash(pki.cert_from_pem(ca_pem)) != ca_hash:
        raise RuntimeError(f"edge presents CA {ca_hash}, cluster has {files.ca_hash}")
    token = await trio.to_thread.run_sync(create_token, files, "bench.edge_load")

    # Keys and certificate requests before anything is timed: we measure the server.
    began = time.perf_counter()
    nodes = []
    for _ in range(n):
        keys = NodeKeys.new()
        keys.ca_pem = ca_pem
        nodes.append(Node(keys, keys.csr_pem()))
    out["client_prep"] = {"keys_and_csrs_s": round(time.perf_counter() - began, 2)}
    log(f"{n} keys and CSRs in {out['client_prep']['keys_and_csrs_s']} s")

    phase[0] = "joins"
    server_rss_start = rss_mib(server.pid)
    ours: dict[str, int | str] = {"server": server.pid, "generator": "self"}
    cpu = CpuWindow(ours).start()
    results, wall, timed_out = await join_all(
        nodes,
        token,
        ca_pem,
        args.join_concurrency,
        time_limit=max(300.0, n * 0.2),
        edges=(edge,),
        progress=log,
    )
    ok = len(results.latencies)
    out["join"] = {
        "concurrency": args.join_concurrency,
        "attempted": n,
        "accepted": ok,
        "errors": dict(results.errors),
        "timed_out": timed_out,
        "wall_s": round(wall, 2),
        "joins_per_s": round(ok / wall, 1) if wall > 0 else None,
        "latency_ms": percentiles(results.latencies),
        "cpu_pct": cpu.stop(),
    }
    log(f"joins: {json.dumps(out['join'])}")

    # Each node's own TLS context (its certificate as client certificate); not timed.
    phase[0] = "client TLS contexts"
    began = time.perf_counter()
    generator_rss_before = rss_mib()
    for node in results.joined:
        node.ctx = edge_client.verified_context(ca_pem, node.keys)
    out["client_prep"]["tls_contexts_s"] = round(time.perf_counter() - began, 2)
    out["client_prep"]["tls_contexts_rss_mib"] = round(rss_mib() - generator_rss_before, 1)
    if args.gc_freeze:
        # Keys, contexts and the rest are here for good: keep full collections off them.
        gc.collect()
        gc.freeze()

    db_before = await trio.to_thread.run_sync(database_view, files)
    await trio.sleep(2)  # let the join burst settle before the baseline
    server_rss_before = rss_mib(server.pid)
    generator_rss_before = rss_mib()

    lag: list[float] = []
    lag_stop = trio.Event()
    joined = results.joined
    async with trio.open_nursery() as nursery:
        nursery.start_soon(loop_lag, lag, lag_stop)
        nursery.start_soon(Heartbeats(streams, nursery).run)
        # Ramp up in batches: the next batch starts when every stream of this one has
        # been welcomed or has failed.
        phase[0] = "ramp"
        began = time.perf_counter()
        cpu = CpuWindow(ours).start()
        segment = CpuWindow(ours).start()
        gc_pauses.take()
        progress: list[dict[str, Any]] = []
        ramp_timed_out = False
        batches = range(0, len(joined), args.ramp_batch)
        report_every = max(1, 1000 // args.ramp_batch)
        for number, start in enumerate(batches):
            batch = joined[start : start + args.ramp_batch]
            send, receive = trio.open_memory_channel[None](len(batch))
            for offset, node in enumerate(batch):
                nursery.start_soon(control_stream, edge, start + offset, node, streams, send)
            with trio.move_on_after(BATCH_TIMEOUT) as scope:
                for _ in batch:
                    await receive.receive()
            if args.gc_freeze:
                gc.freeze()  # the batch's connections live until the end
            if scope.cancelled_caught:
                ramp_timed_out = True
                log(f"batch at {start} not settled in {BATCH_TIMEOUT} s: {streams.snapshot()}")
                break
            if (number + 1) % report_every == 0 or start + len(batch) == len(joined):
                progress.append(
                    {
                        "welcomed": streams.welcomed,
                        "s": round(time.perf_counter() - began, 1),
                        "cpu_pct": segment.stop(),
                        "loop_lag_ms": percentiles(lag)["max"],
                    }
                )
                segment.start()
                lag.clear()
                log(f"streams: {json.dumps(progress[-1])} {streams.snapshot()}")
        ramp = time.perf_counter() - began
        out["control"] = {
            "ramp_batch": args.ramp_batch,
            "attempted": len(joined),
            "welcomed": streams.welcomed,
            "refused": dict(streams.refused),
            "errors": dict(streams.errors),
            "ramp_timed_out": ramp_timed_out,
            "ramp_s": round(ramp, 2),
            "streams_per_s": round(streams.welcomed / ramp, 1) if ramp > 0 else None,
            "connect_latency_ms": percentiles(streams.connect_latencies),
            "cpu_pct": cpu.stop(),
            "generator_gc": gc_pauses.take(),
            "progress": progress,
        }
        log(f"ramp: {json.dumps(out['control'])}")

        # Idle: every stream only heartbeats.
        phase[0] = "idle"
        server_rss_with = rss_mib(server.pid)
        lag.clear()
        streams.measuring = True
        backends = db_before["backend_pids"]
        window = CpuWindow({**ours, **{f"pg{pid}": pid for pid in backends}}).start()
        log(f"idle for {args.idle} s with {streams.open} streams")
        ages: list[float] = []
        sampled = trio.Event()
        nursery.start_soon(sample_membership, files, ages, sampled)
        await trio.sleep(args.idle)
        sampled.set()
        used = window.stop()
        streams.measuring = False
        alive_at_end = streams.alive()
        db_idle = await trio.to_thread.run_sync(database_view, files)
        server_rss_end = rss_mib(server.pid)
        generator_rss_end = rss_mib()
        welcomed = max(1, streams.welcomed)
        postgres = sum(v for k, v in used.items() if k.startswith("pg") and not math.isnan(v))
        out["idle"] = {
            "seconds": args.idle,
            "streams_alive_at_end": alive_at_end,
            "streams_open_at_end": streams.open,
            "streams_ended_during_run": dict(streams.ended),
            "nodes_connected_in_db": db_idle["connected"],
            "server_rss_at_start_mib": server_rss_start,
            "server_rss_before_streams_mib": server_rss_before,
            "server_rss_streams_up_mib": server_rss_with,
            "server_rss_after_idle_mib": server_rss_end,
            "server_rss_per_stream_kib": round(
                (server_rss_end - server_rss_before) * 1024 / welcomed, 1
            ),
            "server_cpu_pct_of_one_core": used["server"],
            "server_postgres_backends_cpu_pct": round(postgres, 1),
            "generator_rss_before_streams_mib": generator_rss_before,
            "generator_rss_mib": generator_rss_end,
            "generator_rss_per_stream_kib": round(
                (generator_rss_end - generator_rss_before) * 1024 / welcomed, 1
            ),
            "generator_cpu_pct_of_one_core": used["generator"],
            "machine_cpu_pct": used["machine"],
            "other_processes_cpu_pct": used["others"],
            "generator_loop_lag_ms": percentiles(lag),
            "generator_gc": gc_pauses.take(),
            "messages_received": dict(streams.received),
            "edges_messages": dict(streams.edges),
            "server_membership_heartbeat_age_s": {
                "samples": len(ages),
                "over_5s": sum(a > 5.0 for a in ages),
                "max": round(max(ages, default=0.0), 1),
            },
            "heartbeats_sent": streams.heartbeats_sent,
            "heartbeat_send_errors": dict(streams.heartbeat_errors),
            "heartbeat_gaps": streams.gap_summary(),
        }
        log(f"idle: {json.dumps(out['idle'])}")

        # Close every stream (the edge then records each node as disconnected).
        phase[0] = "close"
        began = time.perf_counter()
        streams.stop()
        lag_stop.set()
        with trio.move_on_after(CLOSE_TIMEOUT) as scope:
            await streams.all_closed.wait()
        # Whatever is left (streams still connecting after a ramp that timed out).
        nursery.cancel_scope.cancel()
        out["close"] = {
            "close_s": round(time.perf_counter() - began, 2),
            "timed_out": scope.cancelled_caught,
            "ended": dict(streams.ended),
            "close_errors": dict(streams.close_errors),
        }
    # One more round of the edge's batched "seen" updates, then what `node list` shows.
    await trio.sleep(HEARTBEAT + 1)
    out["close"]["server_rss_after_close_mib"] = rss_mib(server.pid)
    db_after = await trio.to_thread.run_sync(database_view, files)
    out["close"]["db_6s_after_close"] = {
        "nodes_connected": db_after["connected"],
        "nodes_with_server_set": db_after["with_server"],
    }
    phase[0] = "done"


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--idle", type=float, default=60.0)
    parser.add_argument("--join-concurrency", type=int, default=16)
    parser.add_argument("--ramp-batch", type=int, default=200)
    parser.add_argument("--address", default=ADDRESS, help="the server's loopback address")
    parser.add_argument(
        "--no-gc-freeze",
        dest="gc_freeze",
        action="store_false",
        help="do not move this process's long-lived objects out of garbage collection",
    )


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 1 or args.join_concurrency < 1 or args.ramp_batch < 1 or args.idle < 0:
        return "--nodes, --join-concurrency and --ramp-batch must be positive"
    return None


SCENARIO = Scenario(
    "edge_load",
    __doc__ or "",
    arguments,
    run,
    servers=lambda args: (args.address,),
    check=check,
)
