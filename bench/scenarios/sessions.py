"""Sessions (docs/sessions.md): keystroke to echo through one server, and what recording
costs the server at a steady output rate.

    python -m bench.sessions [--keys 300] [--rate-mib 1] [--seconds 20]

One server (127.0.0.26) and one real agent on this machine. Keystrokes: a session runs
`cat` on its PTY; one key at a time is sent over the CLI's websocket and timed until its
echo (the PTY's, on the node) is back: p50/p99 of that round trip, CLI → server → edge →
node → PTY and back. Recording: a session's command writes RATE MiB/s of text for SECONDS;
the server process's CPU over that window against an idle window as long before it (every
byte of the output is relayed, recorded, sealed and written in chunks: the server's whole
cost, so an upper bound of the recording's own).
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import trio
import trio_websocket

from bench.measure import cpu_seconds, percentiles
from bench.runner import Bench, Scenario, create_token
from cli.session_client import _ssl_context
from fixtures.agent import AgentProcess, stop_all
from oz0.context import Context
from oz0_common import certs
from oz0_common import session_messages as sm

SERVER = "127.0.0.26"
# The writer on the node: RATE bytes a second of printable text, in 16 pieces a second.
WRITER = (
    "import sys, time\n"
    "rate, seconds = int(sys.argv[1]), float(sys.argv[2])\n"
    "piece = (b'x' * 63 + b'\\n') * (rate // 16 // 64)\n"
    "start = time.monotonic(); n = 0\n"
    "while time.monotonic() - start < seconds:\n"
    "    sys.stdout.buffer.write(piece); sys.stdout.flush(); n += 1\n"
    "    time.sleep(max(0.0, start + n / 16 - time.monotonic()))\n"
)


async def _open(
    bench: Bench, nursery: trio.Nursery, node: str, command: list[str]
) -> trio_websocket.WebSocketConnection:
    context = Context.load(bench.files.context_path)
    tcp = await trio.open_tcp_stream(SERVER, 8443)
    stream = trio.SSLStream(tcp, _ssl_context(context), server_hostname=certs.API_SERVER_NAME)
    await stream.do_handshake()
    ws = await trio_websocket.wrap_client_stream(
        nursery, stream, SERVER, f"/api/v1/nodes/{node}/session"
    )
    await ws.send_message(json.dumps({"type": "open", "command": command, "rows": 24, "cols": 80}))
    while True:
        message = json.loads(await ws.get_message())
        if message["type"] == "started":
            return ws
        if message["type"] == "error":
            raise RuntimeError(message["message"])


async def _keystrokes(bench: Bench, nursery: trio.Nursery, node: str, keys: int) -> dict[str, Any]:
    ws = await _open(bench, nursery, node, ["cat"])
    took: list[float] = []
    for i in range(keys):
        key = "abcdefghijklmnopqrstuvwxyz"[i % 26]
        sent = time.perf_counter()
        await ws.send_message(json.dumps({"type": "input", "data": sm.encode_data(key.encode())}))
        while True:
            message = json.loads(await ws.get_message())
            if message["type"] == "output" and key.encode() in sm.data_of(message):
                break
        took.append(time.perf_counter() - sent)
        await trio.sleep(0.02)
    await ws.send_message(json.dumps({"type": "input", "data": sm.encode_data(b"\x04")}))
    await ws.aclose()
    return {"keys": keys, "echo_ms": percentiles(took)}


async def _recording(
    bench: Bench, nursery: trio.Nursery, node: str, rate: int, seconds: float
) -> dict[str, Any]:
    pid = bench.server.pid
    before = cpu_seconds(pid)
    await trio.sleep(seconds)
    idle = (cpu_seconds(pid) - before) / seconds
    ws = await _open(bench, nursery, node, ["python3", "-c", WRITER, str(rate), str(seconds)])
    received = 0
    began, before = time.monotonic(), cpu_seconds(pid)
    while True:
        message = json.loads(await ws.get_message())
        if message["type"] == "output":
            received += len(sm.data_of(message))
        elif message["type"] in ("exit", "error"):
            break
    wall, busy = time.monotonic() - began, cpu_seconds(pid) - before
    await ws.aclose()
    return {
        "rate_mib_s": round(received / wall / 2**20, 2),
        "seconds": round(wall, 1),
        "server_idle_core_pct": round(100 * idle, 1),
        "server_core_pct": round(100 * busy / wall, 1),
        "added_core_pct": round(100 * (busy / wall - idle), 1),
    }


async def measure(bench: Bench) -> None:
    token = create_token(bench.files, "bench sessions")
    agent = AgentProcess.joining(
        bench.root / "node", [f"{SERVER}:7443"], bench.files.ca_hash, token=token
    ).start()
    bench.cleanups.callback(stop_all, [agent])
    status = await trio.to_thread.run_sync(
        lambda: agent.wait_status(lambda s: s.get("runtime") == "running", timeout=120)
    )
    node = str(status["node_id"])
    rate = int(bench.args.rate_mib * 2**20)
    async with trio.open_nursery() as nursery:
        bench.out["keystrokes"] = await _keystrokes(bench, nursery, node, bench.args.keys)
        bench.out["recording"] = await _recording(bench, nursery, node, rate, bench.args.seconds)
        nursery.cancel_scope.cancel()


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=300)
    parser.add_argument("--rate-mib", type=float, default=1.0)
    parser.add_argument("--seconds", type=float, default=20.0)


SCENARIO = Scenario(
    "sessions",
    __doc__ or "",
    arguments,
    run=measure,
    servers=lambda _: [SERVER],
    measured=("oz0", "oz0_node", "cli"),
)
