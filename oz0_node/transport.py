"""One websocket to one edge: TCP, TLS, the websocket handshake, then JSON messages.

The raw byte stream comes from an `OpenStream` function (TCP by default), so tests can hand
the agent in-memory streams and run it on Trio's MockClock; TLS and websockets are the
real thing either way. Every failure to reach or use an edge becomes `EdgeUnavailable`.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import cast

import trio
from trio_websocket import (
    ConnectionClosed,
    HandshakeError,
    WebSocketConnection,
    wrap_client_stream,
)

from oz0_common.addresses import host_port
from oz0_node import addresses, messages
from oz0_node.errors import EdgeSilent, EdgeUnavailable, one_error
from oz0_node.messages import Message
from oz0_node.tls import check_edge_certificate

log = logging.getLogger(__name__)

OpenStream = Callable[[str, int], Awaitable[trio.abc.Stream]]

# TCP connect, TLS handshake and websocket upgrade, each.
CONNECT_TIMEOUT = 10.0
# A polite websocket close; after it the stream is closed regardless.
CLOSE_TIMEOUT = 1.0
# What one read from the TLS stream takes at most (trio-websocket's default, 4 KiB, made a
# pushed file's pieces, 341 KiB each, some 85 reads apiece).
RECEIVE_SIZE = 64 * 1024


async def open_tcp(host: str, port: int) -> trio.abc.Stream:
    return await trio.open_tcp_stream(host, port)


class EdgeConnection:
    """A websocket to the edge at ADDRESS that speaks protocol messages."""

    def __init__(self, ws: WebSocketConnection, address: str) -> None:
        self.ws = ws
        self.address = address

    async def receive(self, within: float) -> Message:
        """The next message; EdgeSilent if none comes WITHIN seconds."""
        try:
            with trio.fail_after(within):
                raw = await self.ws.get_message()
        except trio.TooSlowError:
            raise EdgeSilent(f"edge {self.address} sent nothing for {within:g} s") from None
        except ConnectionClosed as e:
            raise EdgeUnavailable(f"edge {self.address} closed the connection{_why(e)}") from None
        return messages.decode(raw, self.address)

    async def send(self, kind: str, **fields: object) -> None:
        try:
            await self.ws.send_message(messages.encode(kind, **fields))
        except ConnectionClosed as e:
            raise EdgeUnavailable(f"edge {self.address} closed the connection{_why(e)}") from None


def _os_reason(error: OSError) -> str:
    """Why a connection failed: trio's "all attempts failed" hides the reasons in a group."""
    cause = error.__cause__
    if error.strerror is None and isinstance(cause, BaseExceptionGroup):
        reasons = {str(e.strerror or e) for e in cause.exceptions if isinstance(e, OSError)}
        if reasons:
            return "; ".join(sorted(reasons))
    return str(error.strerror or error)


def _why(closed: ConnectionClosed) -> str:
    reason = closed.reason
    if reason is None or (reason.code == 1000 and not reason.reason):
        return ""
    return f" ({reason.code} {reason.reason or reason.name})"


async def _open_tls(
    address: str, tls: ssl.SSLContext, cluster: str | None, open_stream: OpenStream
) -> trio.SSLStream[trio.abc.Stream]:
    host, port = addresses.split(address)
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            raw = await open_stream(host, port)
    except trio.TooSlowError:
        raise EdgeUnavailable(f"edge {address}: no connection in {CONNECT_TIMEOUT:g} s") from None
    except OSError as e:
        raise EdgeUnavailable(f"cannot reach edge {address}: {_os_reason(e)}") from None
    stream = trio.SSLStream(raw, tls, server_hostname=host)
    try:
        with trio.fail_after(CONNECT_TIMEOUT):
            await stream.do_handshake()
        if cluster is not None:
            check_edge_certificate(stream.getpeercert(binary_form=True), cluster, address)
    except BaseException as e:
        await trio.aclose_forcefully(stream)
        if isinstance(e, trio.TooSlowError):
            raise EdgeUnavailable(f"edge {address}: TLS handshake timed out") from None
        if isinstance(e, trio.BrokenResourceError):
            raise EdgeUnavailable(f"edge {address}: TLS failed: {e.__cause__ or e}") from None
        raise
    return stream


@asynccontextmanager
async def open_edge(
    address: str,
    path: str,
    tls: ssl.SSLContext,
    *,
    cluster: str | None,
    open_stream: OpenStream = open_tcp,
) -> AsyncIterator[EdgeConnection]:
    """A websocket to ADDRESS at PATH.

    With CLUSTER, TLS must verify and the edge's certificate must be a server's of CLUSTER;
    without it (pinning only) nothing is checked. Closed politely on the way out.
    """
    stream = await _open_tls(address, tls, cluster, open_stream)
    host, port = addresses.split(address)
    try:
        async with trio.open_nursery() as nursery:
            try:
                with trio.fail_after(CONNECT_TIMEOUT):
                    # trio-websocket's hint says SocketStream, but any Stream works.
                    ws = await wrap_client_stream(
                        nursery,
                        cast(trio.SSLStream[trio.SocketStream], stream),
                        host_port(host, port),
                        path,
                        receive_buffer_size=RECEIVE_SIZE,
                    )
            except trio.TooSlowError:
                raise EdgeUnavailable(f"edge {address}: websocket handshake timed out") from None
            try:
                yield EdgeConnection(ws, address)
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TIMEOUT):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except BaseExceptionGroup as group:
        error = one_error(group)
        if isinstance(error, HandshakeError):
            raise EdgeUnavailable(f"edge {address} refused the websocket: {error!r}") from None
        raise error from None
    finally:
        await trio.aclose_forcefully(stream)
