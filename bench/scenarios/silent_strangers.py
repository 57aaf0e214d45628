"""Silent strangers: thousands of unauthenticated connections that finish TLS and say
nothing, against one edge that also carries connected nodes (issue 9, Measure).

    python -m bench.silent_strangers [--strangers S] [--nodes N] [--flood SECONDS]
                                     [--per-address A]

The runner (bench/runner.py) starts a fresh test cluster and ONE real server on
127.0.0.84; then, from this one process:

1. joins N nodes with a token and opens their control streams (real TLS, each node's own
   certificate), answering and sending heartbeats every 5 s;
2. for SECONDS keeps S strangers going: each opens a TCP connection from one of S / A
   source addresses (127.0.0.100 and up), finishes the TLS handshake and stays silent
   until the server closes it, then at once connects again;
3. meanwhile measures the server's RSS and CPU, the strangers held open at once and those
   closed before their handshake (over a cap), the nodes' longest gap between messages
   from the edge and whether any stream ended, and whether a new node can join and an
   existing one open a second stream during the flood;
4. stops the strangers and the nodes.
"""

from __future__ import annotations

import argparse
import json
import ssl
import time
from dataclasses import dataclass, field
from typing import Any

import trio

from bench.measure import CpuWindow, rss_mib
from bench.runner import Bench, Scenario, create_token, failure_text, log
from fixtures import edge_client, strangers
from fixtures.cluster import ClusterFiles, ServerProcess
from fixtures.edge_client import HEARTBEAT, NodeKeys
from oz0_common.addresses import EDGE_PORT

ADDRESS = "127.0.0.84"
EDGE = f"{ADDRESS}:{EDGE_PORT}"


@dataclass
class Tally:
    held_now: int = 0
    held_max: int = 0
    handshakes: int = 0
    refused_at_once: int = 0
    other_errors: int = 0
    open_for: list[float] = field(default_factory=list)
    node_gaps: list[float] = field(default_factory=list)
    streams_ended: int = 0


async def stranger(source: str, ctx: ssl.SSLContext, tally: Tally, stop: trio.Event) -> None:
    while not stop.is_set():
        try:
            stream = await strangers.open_tls(ADDRESS, EDGE_PORT, source, ctx)
        except (trio.BrokenResourceError, OSError):
            tally.refused_at_once += 1
            await trio.sleep(0.05)  # a real flood would not wait; this spares the CPU
            continue
        except trio.TooSlowError:
            tally.other_errors += 1
            continue
        tally.handshakes += 1
        tally.held_now += 1
        tally.held_max = max(tally.held_max, tally.held_now)
        began = trio.current_time()
        try:
            with trio.move_on_after(60):
                await strangers.wait_closed(stream)
            tally.open_for.append(trio.current_time() - began)
        finally:
            tally.held_now -= 1
            await trio.aclose_forcefully(stream)


async def node_stream(
    keys: NodeKeys,
    tally: Tally,
    stop: trio.Event,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with edge_client.control(EDGE, keys) as (ws, welcome):
        assert welcome["type"] == "welcome", welcome
        task_status.started()
        last = trio.current_time()

        async def beat() -> None:
            while True:
                await edge_client.send(ws, "heartbeat")
                await trio.sleep(HEARTBEAT)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(beat)
            try:
                while not stop.is_set():
                    with trio.move_on_after(1):
                        await ws.get_message()
                        now = trio.current_time()
                        tally.node_gaps.append(now - last)
                        last = now
            except Exception:
                tally.streams_ended += 1
            nursery.cancel_scope.cancel()


async def probe_join(token: str, out: dict[str, Any]) -> None:
    """A new node's join and an existing node's second stream, while the flood runs."""
    keys = NodeKeys.new()
    began = trio.current_time()
    try:
        keys.ca_pem, _ = await edge_client.fetch_ca(EDGE)
        answer = await edge_client.join(EDGE, keys, token=token)
        out["probe_join"] = {"answer": answer["type"], "s": round(trio.current_time() - began, 2)}
        async with edge_client.control(EDGE, keys) as (_, welcome):
            out["probe_stream"] = welcome["type"]
    except Exception as e:
        out["probe_join"] = {"failed": failure_text(e), "s": round(trio.current_time() - began, 2)}


async def run(bench: Bench) -> None:
    await measure(bench.args, bench.files, bench.server, bench.out)


async def measure(args: argparse.Namespace, files: ClusterFiles, server: ServerProcess,
              out: dict[str, Any]) -> None:  # fmt: skip
    strangers.raise_open_file_limit()
    token = create_token(files, "bench.silent_strangers")
    ca_pem, _ = await edge_client.fetch_ca(EDGE)
    nodes = []
    for _ in range(args.nodes):
        keys = NodeKeys.new()
        keys.ca_pem = ca_pem
        assert (await edge_client.join(EDGE, keys, token=token))["state"] == "accepted"
        nodes.append(keys)
    tally = Tally()
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        # One after the other: all from 127.0.0.1, they would otherwise meet the cap per
        # address during their TLS handshakes.
        for keys in nodes:
            await nursery.start(node_stream, keys, tally, stop)
        await trio.sleep(2 * HEARTBEAT)
        quiet = CpuWindow({"server": server.pid}).start()
        await trio.sleep(HEARTBEAT)
        out["before"] = {"server_rss_mib": rss_mib(server.pid), "cpu": quiet.stop()}
        tally.node_gaps.clear()
        log(f"{args.nodes} nodes streaming; {args.strangers} strangers for {args.flood} s")
        flood = CpuWindow({"server": server.pid, "generator": "self"}).start()
        rss = []
        async with trio.open_nursery() as crowd:
            ctx = strangers.unverified()  # one for all: making one reads the system's CAs
            for i in range(args.strangers):
                source = f"127.0.0.{100 + i // args.per_address}"
                crowd.start_soon(stranger, source, ctx, tally, stop)
            began = time.monotonic()
            probed = False
            while time.monotonic() - began < args.flood:
                await trio.sleep(1)
                rss.append(rss_mib(server.pid))
                if not probed and time.monotonic() - began > args.flood / 2:
                    probed = True
                    crowd.start_soon(probe_join, token, out)
                if server.process is not None and server.process.poll() is not None:
                    raise RuntimeError("the server exited")
            out["during"] = {
                "server_rss_mib_max": max(rss),
                "cpu": flood.stop(),
                "held_at_once_max": tally.held_max,
                "handshakes": tally.handshakes,
                "refused_at_once": tally.refused_at_once,
                "other_errors": tally.other_errors,
                "held_for_s_max": round(max(tally.open_for, default=0), 1),
                "node_gap_s_max": round(max(tally.node_gaps, default=0), 2),
                "node_streams_ended": tally.streams_ended,
            }
            log(json.dumps(out["during"]))
            stop.set()
            crowd.cancel_scope.cancel()
        await trio.sleep(12)
        out["after"] = {"server_rss_mib": rss_mib(server.pid)}
        nursery.cancel_scope.cancel()


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--strangers", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--flood", type=float, default=60.0)
    parser.add_argument("--per-address", type=int, default=60)


SCENARIO = Scenario(
    "silent_strangers",
    __doc__ or "",
    arguments,
    run,
    servers=lambda _: (ADDRESS,),
)
