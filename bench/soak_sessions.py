"""The soak's sessions (issue 44): a session opened on a node the way the CLI opens one
(`node exec NODE -- ...`, cli/session_client.py: a websocket to /api/v1/nodes/NODE/session
on a server's management API, followed to the server that holds the node's stream), its
command wrapped by the ledger and run without a terminal, its output read until its exit
code comes, then closed. At the end, every session the cluster lists is read back through
the API (its record and its recording's output) for the checker's `session_lost`.

A session refused or broken (its node or its server under a fault) is counted, not judged.
"""

from __future__ import annotations

import json
import random
import ssl
from dataclasses import dataclass

import trio
import trio_websocket

from bench.soak_model import SessionRecord
from bench.soak_state import ADDRESSES, Soak
from bench.soak_workload import SessionPlan
from cli.session_client import (
    Elsewhere,
    SessionError,
    _management_address,
    _ssl_context,
    each_server,
)
from oz0.context import MANAGEMENT_PORT
from oz0_common import certs
from oz0_common import session_messages as sm

CONNECT_TIMEOUT = 10.0
SIZE = sm.WindowSize(24, 80)
# The most sessions read back at the end (GET /api/v1/sessions's limit).
LISTED = 1000


class Broken(Exception):
    """The session was refused or ended without an exit code (said, not judged)."""


@dataclass(eq=False)
class Seen:
    """A session as the soak saw it: its ID once started, what it was shown, its end."""

    node: str
    minute: float
    session: str | None = None
    received: bytes = b""
    exit_code: int | None = None
    error: str | None = None


async def session(soak: Soak, plan: SessionPlan, rng: random.Random) -> None:
    agents = [a for a in soak.fleet.agents if not a.gone and a.node_id]
    if not agents:
        return
    seen = Seen(rng.choice(agents).node_id, soak.minute())
    soak.sessions.append(seen)
    command = soak.ledger.wrapped(plan.command)
    try:
        with trio.fail_after(plan.bound):
            await converse(soak, seen, command)
    except (Broken, SessionError) as e:
        seen.error = str(e)[:200]
    except (OSError, trio.TooSlowError, trio_websocket.HandshakeError) as e:
        seen.error = f"{type(e).__name__}: {e}"[:200]


async def converse(soak: Soak, seen: Seen, command: list[str]) -> None:
    """The session through the servers in turn (a different first one each time), as the
    CLI goes: the same loop, cli.session_client.each_server."""
    assert soak.context is not None
    tls = _ssl_context(soak.context)
    soak.api_turn += 1
    first = soak.api_turn % len(ADDRESSES)
    servers = [f"{a}:{MANAGEMENT_PORT}" for a in ADDRESSES[first:] + ADDRESSES[:first]]

    async def step(server: str) -> Elsewhere | None:
        return await through(server, tls, soak, seen, command)

    await each_server(servers, step)


async def through(
    server: str, tls: ssl.SSLContext, soak: Soak, seen: Seen, command: list[str]
) -> Elsewhere | None:
    """The session through SERVER: None when it ended, or the server holding the node."""
    host, _, port = server.rpartition(":")
    with trio.fail_after(CONNECT_TIMEOUT):
        tcp = await trio.open_tcp_stream(host, int(port))
        stream = trio.SSLStream(tcp, tls, server_hostname=certs.API_SERVER_NAME)
        await stream.do_handshake()
    path = f"/api/v1/nodes/{seen.node}/session"
    answer: Elsewhere | None = None
    error: str | None = None
    try:
        async with trio.open_nursery() as nursery:
            # Errors kept and raised after the nursery: not wrapped in an exception group.
            try:
                ws = await trio_websocket.wrap_client_stream(nursery, stream, host, path)
            except trio_websocket.HandshakeError as e:
                raise OSError(f"refused the session's websocket ({e})") from None
            try:
                answer = await messages(ws, seen, command)
            except Broken as e:
                error = str(e)
            except (trio_websocket.ConnectionClosed, sm.BadSessionMessage) as e:
                error = f"{type(e).__name__}: {e}"
            finally:
                with trio.move_on_after(1):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    finally:
        # trio-websocket's client leaves the socket open when the server closes first
        # and the wait for its TCP close is cancelled.
        await trio.aclose_forcefully(stream)
    if error is not None:
        raise Broken(error)
    return answer


async def messages(
    ws: trio_websocket.WebSocketConnection, seen: Seen, command: list[str]
) -> Elsewhere | None:
    mode = sm.Mode(tty=False, stdin=False, user=None)
    await ws.send_message(json.dumps({"type": "open", "command": command, "term": None,
                                      **SIZE.fields(), **mode.fields()}))  # fmt: skip
    while True:
        message = json.loads(await ws.get_message())
        kind = message.get("type")
        if kind == "started":
            seen.session = sm.session_of(message)
        elif kind == "output":
            seen.received += sm.data_of(message)
        elif kind == "exit":
            seen.exit_code = sm.exit_code_of(message)
            return None
        elif kind == "elsewhere" and seen.session is None:
            return _management_address(str(message.get("server")))
        elif kind == "error":
            raise Broken(str(message.get("message")))


async def read_back(soak: Soak) -> list[SessionRecord]:
    """Every session the cluster lists, with what the soak was shown of it and what its
    recording holds (None where the API did not answer)."""
    listed = await soak.call("GET", f"/api/v1/sessions?limit={LISTED}")
    if listed is None:
        return []
    shown = {s.session: s for s in soak.sessions if s.session is not None}
    found = []
    for row in listed["sessions"]:
        answer = await soak.call("GET", f"/api/v1/sessions/{row['id']}/recording")
        seen = shown.get(row["id"])
        found.append(
            SessionRecord(
                row["id"], row["node"], seen.minute if seen else 0.0,
                seen.received if seen else b"", row["exit_code"], bool(row["live"]),
                None if answer is None else asciicast_output(answer["asciicast"]),
            )
        )  # fmt: skip
    return found


def asciicast_output(asciicast: str) -> bytes:
    """The output events of an asciicast v2 file, joined."""
    out = bytearray()
    for line in asciicast.splitlines()[1:]:
        event = json.loads(line)
        if isinstance(event, list) and len(event) == 3 and event[1] == "o":
            out += str(event[2]).encode()
    return bytes(out)
