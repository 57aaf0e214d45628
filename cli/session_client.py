"""The CLI's end of an interactive session (`node exec`, `node shell`; docs/sessions.md):
a websocket to the management API of the server holding the node's stream, this
terminal in raw mode at the other end.

Imported only by those commands: it brings Trio and trio-websocket, which no other
client command needs.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import termios
import tty
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import trio
import trio_websocket

from oz0.context import Context, ContextError, check_address, server_address
from oz0.errors import Oz0Error
from oz0_common import certs
from oz0_common import session_messages as sm

CONNECT_TIMEOUT = 10.0
# Another server holds the node's stream: connect there, once.
MAX_HOPS = 2
# What a terminal too small to ask says it is.
DEFAULT_SIZE = sm.WindowSize(24, 80)
# Sent when stdin ends on a session with a PTY: its end-of-file character (without a PTY,
# the end itself is sent: the command's stdin is closed).
EOF_CHARACTER = b"\x04"
READ_SIZE = 16 * 1024


T = TypeVar("T")


class SessionError(Oz0Error):
    pass


@dataclass(frozen=True)
class Elsewhere:
    """The management API of the server holding the node's stream, as another named it."""

    server: str


async def each_server(servers: Sequence[str], step: Callable[[str], Awaitable[T | Elsewhere]]) -> T:
    """STEP's answer from the first of SERVERS that answers (one that cannot be reached
    (OSError) is passed over), following a server that names the one holding the node's
    stream at most MAX_HOPS times. SessionError when none answers."""
    left = list(servers)
    failures: list[str] = []
    hops = 0
    while left:
        server = left.pop(0)
        try:
            answer = await step(server)
        except OSError as e:
            failures.append(f"{server}: {e.strerror or e}")
            continue
        if not isinstance(answer, Elsewhere):
            return answer
        hops += 1
        if hops >= MAX_HOPS:
            raise SessionError(
                f"the servers sent this session from one to another ({answer.server})"
            )
        left = [answer.server]
    raise SessionError("no server of the context answered: " + "; ".join(failures))


def check_user(user: str | None) -> None:
    """SessionError (one line) unless USER is None or could be an account's name."""
    if user is not None and not sm.USER_NAME.fullmatch(user):
        raise SessionError(f"--user {user!r} is not an account's name")


def window_size() -> sm.WindowSize:
    for fd in (1, 0, 2):
        try:
            size = os.get_terminal_size(fd)
        except OSError:
            continue
        if size.lines > 0 and size.columns > 0:
            return sm.WindowSize(min(size.lines, sm.MAX_SIDE), min(size.columns, sm.MAX_SIDE))
    return DEFAULT_SIZE


@contextmanager
def raw_terminal(enabled: bool) -> Iterator[None]:
    """Stdin in raw mode while the block runs (keys go to the node as typed: Ctrl-C
    reaches the remote command, not this one), restored after, whatever happens."""
    if not enabled or not os.isatty(0):
        yield
        return
    saved = termios.tcgetattr(0)
    try:
        tty.setraw(0)
        yield
    finally:
        termios.tcsetattr(0, termios.TCSADRAIN, saved)


def run_session(
    context: Context,
    node_id: str,
    command: list[str],
    *,
    interactive: bool,
    terminal: bool,
    user: str | None = None,
) -> int:
    """Run COMMAND on NODE_ID; its exit code. INTERACTIVE: stdin goes to it; TERMINAL: it
    has a PTY and this terminal is raw meanwhile, else it has pipes (its stdout here to
    stdout, its stderr to stderr); USER: as that account of the node."""
    mode = sm.Mode(tty=terminal, stdin=interactive, user=user)
    with raw_terminal(terminal):
        return trio.run(_session, context, node_id, command, mode)


def _ssl_context(context: Context) -> ssl.SSLContext:
    tls = ssl.create_default_context(cafile=str(context.ca_path))
    # As cli/client.py: the CA pin and the server role in the certificate stand in for
    # the host name check.
    tls.check_hostname = False
    tls.load_cert_chain(str(context.cert_path), str(context.key_path))
    return tls


async def _session(context: Context, node_id: str, command: list[str], mode: sm.Mode) -> int:
    tls = _ssl_context(context)

    async def step(server: str) -> int | Elsewhere:
        return await _one_server(server, tls, context, node_id, command, mode)

    return await each_server(context.addresses, step)


async def _one_server(
    server: str,
    tls: ssl.SSLContext,
    context: Context,
    node_id: str,
    command: list[str],
    mode: sm.Mode,
) -> int | Elsewhere:
    """The session through SERVER: its exit code, or the server that holds the node."""
    host, _, port = server.rpartition(":")
    host = host.strip("[]")
    with trio.fail_after(CONNECT_TIMEOUT):
        tcp = await trio.open_tcp_stream(host, int(port))
        stream = trio.SSLStream(tcp, tls, server_hostname=certs.API_SERVER_NAME)
        await stream.do_handshake()
    der = stream.getpeercert(binary_form=True)
    identity = certs.identity_of_der(der) if der else None
    if (
        identity is None
        or identity.role != certs.Role.SERVER
        or identity.cluster != context.cluster
    ):
        await stream.aclose()
        raise OSError(f"{server} is not a server of cluster {context.cluster}")
    path = f"/api/v1/nodes/{urllib.parse.quote(node_id, safe='')}/session"
    try:
        return await _through(stream, host, path, command, mode)
    except BaseExceptionGroup as group:
        raise _one_error(group) from None
    finally:
        # trio-websocket's client leaves the socket open when the server closes first
        # and the wait for its TCP close is cancelled.
        await trio.aclose_forcefully(stream)


def _one_error(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The error of GROUP to say (a session's nursery's): its first that is not a
    cancellation, or GROUP itself."""
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            return _one_error(error)
        if not isinstance(error, trio.Cancelled):
            return error
    return group


async def _through(
    stream: trio.SSLStream[trio.SocketStream],
    host: str,
    path: str,
    command: list[str],
    mode: sm.Mode,
) -> int | Elsewhere:
    async with trio.open_nursery() as nursery:
        try:
            ws = await trio_websocket.wrap_client_stream(nursery, stream, host, path)
        except trio_websocket.HandshakeError as e:
            raise OSError(f"refused the session's websocket ({e})") from None
        try:
            answer = await _converse(ws, command, mode, nursery)
        finally:
            # Before the nursery's cancel: cancelled, the close would end this function
            # without its answer.
            with trio.move_on_after(1):
                await ws.aclose()
            nursery.cancel_scope.cancel()
    return answer


async def _send(ws: trio_websocket.WebSocketConnection, kind: str, **fields: Any) -> None:
    await ws.send_message(json.dumps({"type": kind, **fields}))


async def _converse(
    ws: trio_websocket.WebSocketConnection,
    command: list[str],
    mode: sm.Mode,
    nursery: trio.Nursery,
) -> int | Elsewhere:
    size = window_size()
    term = os.environ.get("TERM") or None
    await _send(ws, "open", command=command, term=term, **size.fields(), **mode.fields())
    started = False
    window = _Window(size) if mode.tty else None
    while True:
        try:
            raw = await ws.get_message()
        except trio_websocket.ConnectionClosed:
            raise SessionError("the server ended the session without an exit code") from None
        message = json.loads(raw)
        kind = message.get("type")
        if kind == "output":
            await _write_out(2 if message.get("stream") == sm.STDERR else 1, sm.data_of(message))
        elif kind == "started" and not started:
            started = True
            if window is not None:
                nursery.start_soon(_follow_resizes, ws, window)
            if mode.stdin:
                nursery.start_soon(_send_input, ws, window)
        elif kind == "exit":
            return sm.exit_code_of(message)
        elif kind == "elsewhere" and not started:
            server = message.get("server")
            if not isinstance(server, str):
                raise SessionError("the server named no server that holds the node")
            return _management_address(server)
        elif kind == "error":
            raise SessionError(str(message.get("message")))


def _management_address(advertise: str) -> Elsewhere:
    """The management API of the server advertised as ADVERTISE."""
    try:
        return Elsewhere(check_address(server_address(advertise)))
    except ContextError:
        raise SessionError(f"the server named an invalid address {advertise!r}") from None


async def _write_out(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except BlockingIOError:
            await trio.lowlevel.wait_writable(fd)
            continue
        view = view[written:]


class _Window:
    """The window size the session was last told, told again whenever it changed: on
    SIGWINCH, and before any input (SIGWINCH comes on its own time, late on a loaded
    machine, and keys typed after a resize must not reach the command before it: a
    `stty size` would answer the old size)."""

    def __init__(self, told: sm.WindowSize) -> None:
        self.told = told
        # One teller at a time: a resize and the input after it go out in that order.
        self._lock = trio.Lock()

    async def tell(self, ws: trio_websocket.WebSocketConnection) -> None:
        async with self._lock:
            await self._tell_locked(ws)

    async def send_input(self, ws: trio_websocket.WebSocketConnection, data: str) -> None:
        async with self._lock:
            await self._tell_locked(ws)
            await _send(ws, "input", data=data)

    async def _tell_locked(self, ws: trio_websocket.WebSocketConnection) -> None:
        size = window_size()
        if size != self.told:
            await _send(ws, "resize", **size.fields())
            self.told = size


async def _send_input(ws: trio_websocket.WebSocketConnection, window: _Window | None) -> None:
    """Stdin to the session as it comes (a worker thread blocks on it: stdin's flags are
    the terminal's, left as they are); at its end, with a terminal (WINDOW) the PTY's
    end-of-file character, without one the end itself."""
    while True:
        data = await trio.to_thread.run_sync(os.read, 0, READ_SIZE, abandon_on_cancel=True)
        if window is not None:
            await window.send_input(ws, sm.encode_data(data or EOF_CHARACTER))
            if not data:
                return
        elif not data:
            await _send(ws, "input", data="", eof=True)
            return
        else:
            await _send(ws, "input", data=sm.encode_data(data))


async def _follow_resizes(ws: trio_websocket.WebSocketConnection, window: _Window) -> None:
    with trio.open_signal_receiver(signal.SIGWINCH) as signals:
        async for _ in signals:
            await window.tell(ws)
