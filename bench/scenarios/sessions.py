"""Sessions (docs/sessions.md): keystroke to echo through one server, and what recording
costs the server at a steady output rate.

    python -m bench.sessions [--keys 300] [--rate-mib 1] [--seconds 20]

One server (127.0.0.26) and one real agent on this machine. Keystrokes: a session runs
`cat` on its PTY; one key at a time is sent over the CLI's websocket and timed until its
echo (the PTY's, on the node) is back: p50/p99 of that round trip, CLI → server → edge →
node → PTY and back. Recording: a session's command writes RATE MiB/s of text for SECONDS;
the server process's CPU over that window against an idle window as long before it (every
byte of the output is relayed, recorded, sealed and written in chunks: the server's whole
cost, so an upper bound of the recording's own). Then the recording alone: the same output,
in as many pieces and as many chunks as the server's session had, at the same pace, given
to the server's own Recording (session_recording.py) in this process: the CPU of this
process (less what the same pacing costs without recording) and of its one PostgreSQL
backend over that window is what recording costs.
"""

from __future__ import annotations

import argparse
import json
import secrets
import time
from functools import partial
from typing import Any

import psycopg
import trio
import trio_websocket
from psycopg.rows import dict_row

from bench.measure import cpu_seconds, percentiles
from bench.runner import Bench, Scenario, create_token
from cli.session_client import _ssl_context
from fixtures.agent import AgentProcess, stop_all
from oz0 import node_sessions
from oz0.context import Context
from oz0.server.session_recording import Recording
from oz0.store.pool import open_database
from oz0_common import certs
from oz0_common import session_messages as sm
from oz0_common.addresses import EDGE_PORT

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
    received = pieces = 0
    began, before = time.monotonic(), cpu_seconds(pid)
    while True:
        message = json.loads(await ws.get_message())
        if message["type"] == "output":
            received += len(sm.data_of(message))
            pieces += 1
        elif message["type"] in ("exit", "error"):
            break
    wall, busy = time.monotonic() - began, cpu_seconds(pid) - before
    await ws.aclose()
    bench.out["recording_alone"] = await _recording_alone(bench, pieces, received, wall)
    return {
        "rate_mib_s": round(received / wall / 2**20, 2),
        "seconds": round(wall, 1),
        "server_idle_core_pct": round(100 * idle, 1),
        "server_core_pct": round(100 * busy / wall, 1),
        "added_core_pct": round(100 * (busy / wall - idle), 1),
    }


def _newest_session(url: str) -> dict[str, Any]:
    """The session the recording window ran: its row and how many chunks it wrote."""
    with psycopg.connect(url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT s.*, (SELECT count(*) FROM session_chunks c WHERE c.session_id = s.id)"
            " AS chunks FROM sessions s ORDER BY started_at DESC LIMIT 1"
        ).fetchone()
    assert row is not None, "no session recorded"
    return row


async def _recording_alone(bench: Bench, pieces: int, received: int, wall: float) -> dict[str, Any]:
    """RECEIVED bytes in PIECES over WALL seconds through a Recording of this process, into
    as many chunks as the server wrote for its session; the CPU that takes here and in the
    one database backend it writes with, in percent of a core."""
    url = bench.files.main_db
    real = _newest_session(url)
    chunks = max(int(real["chunks"]), 1)
    piece = (b"x" * 63 + b"\n") * max(received // max(pieces, 1) // 64, 1)
    session_id = sm.new_id()
    async with open_database(url, min_size=1, max_size=1, own_threads=True) as db:
        await db.transaction(
            partial(node_sessions.create, session_id=session_id, tenant=real["tenant"],
                    node_id=real["node_id"], person=real["person"], command=["bench"],
                    header=real["header"], server=real["server"], records_input=False)
        )  # fmt: skip
        backend = await db.transaction(
            lambda conn: int(conn.execute("SELECT pg_backend_pid()").fetchone()[0])  # type: ignore[index]
        )
        recording = Recording(db, secrets.token_bytes(32), "bench", session_id, records_input=False)
        every = max(pieces // chunks, 1)

        async def paced(record: bool) -> tuple[float, float, float]:
            """Wall seconds, this process's and the backend's CPU seconds: the pieces at
            the session's pace, given to the recording or (RECORD false) not, so that what
            the pacing itself costs is known and taken away."""
            began = time.monotonic()
            mine, theirs = cpu_seconds(), cpu_seconds(backend)
            for n in range(pieces):
                if record:
                    recording.output(piece)
                    if (n + 1) % every == 0 or n + 1 == pieces:
                        await recording.flush()
                await trio.sleep(max(0.0, began + (n + 1) * wall / pieces - time.monotonic()))
            return (
                time.monotonic() - began,
                cpu_seconds() - mine,
                cpu_seconds(backend) - theirs,
            )

        idle_took, idle_mine, _ = await paced(record=False)
        took, mine, theirs = await paced(record=True)
        await db.transaction(
            lambda conn: conn.execute("DELETE FROM sessions WHERE id = %s", (session_id,))
        )
    return {
        "pieces": pieces,
        "chunks": chunks,
        "rate_mib_s": round(len(piece) * pieces / took / 2**20, 2),
        "pacing_core_pct": round(100 * idle_mine / idle_took, 1),
        "recording_core_pct": round(100 * (mine / took - idle_mine / idle_took), 1),
        "database_core_pct": round(100 * theirs / took, 1),
        "total_core_pct": round(100 * (mine / took - idle_mine / idle_took + theirs / took), 1),
    }


async def measure(bench: Bench) -> None:
    token = create_token(bench.files, "bench sessions")
    agent = AgentProcess.joining(
        bench.root / "node", [f"{SERVER}:{EDGE_PORT}"], bench.files.ca_hash, token=token
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
