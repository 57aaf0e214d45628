"""Serve an ASGI app over our own TLS listener, handing the app the peer's certificate.

Hypercorn puts nothing about the client certificate into the ASGI scope, so each
connection is handshaken here, its certificate read from the `trio.SSLStream`, and the
connection then given to hypercorn's `TCPServer` with an app wrapper that adds the
certificate to every scope as `scope["extensions"]["oz0.peer_cert_der"]` (bytes or None).
hypercorn is pinned for this reason.

Connections that have not authenticated are admitted within limits (`oz0.server.admission`)
and bounded in time: the TLS handshake, the wait for a request's headers, each read and
each send (hypercorn sends shielded from cancellation, so a peer that never reads would
hold its connection for ever) and the close.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from functools import partial
from typing import Any

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from oz0.server.admission import Admission, peer_address
from oz0.server.tls import open_tls_listeners

log = logging.getLogger(__name__)

PEER_CERT_KEY = "oz0.peer_cert_der"
HANDSHAKE_TIMEOUT = 10.0
# From the handshake (or the previous answer) to a request's complete headers.
REQUEST_TIMEOUT = 10
SEND_TIMEOUT = 10.0
CLOSE_TIMEOUT = 5.0
MAX_HEADERS_SIZE = 16 * 1024


class _BoundedStream(trio.abc.Stream):
    """The connection as hypercorn's `TCPServer` sees it, with sends and close bounded.

    A send that does not finish in SEND_TIMEOUT reads as a broken connection, which
    hypercorn handles by closing it.
    """

    def __init__(self, inner: trio.SSLStream[trio.SocketStream]) -> None:
        self._inner = inner

    @property
    def transport_stream(self) -> trio.SocketStream:
        return self._inner.transport_stream

    async def do_handshake(self) -> None:
        await self._inner.do_handshake()

    def selected_alpn_protocol(self) -> str | None:
        protocol: str | None = self._inner.selected_alpn_protocol()
        return protocol

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        try:
            with trio.fail_after(SEND_TIMEOUT):
                await self._inner.send_all(data)
        except trio.TooSlowError:
            await trio.aclose_forcefully(self._inner)
            raise trio.BrokenResourceError("the client did not read our answer in time") from None

    async def wait_send_all_might_not_block(self) -> None:
        await self._inner.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._inner.receive_some(max_bytes)

    async def aclose(self) -> None:
        with trio.move_on_after(CLOSE_TIMEOUT) as closing:
            await self._inner.aclose()
        if closing.cancelled_caught:
            await trio.aclose_forcefully(self._inner)


class _WithPeerCert:
    """A hypercorn app wrapper adding one connection's peer certificate to its scopes."""

    def __init__(self, inner: ASGIWrapper, peer_cert_der: bytes | None) -> None:
        self._inner = inner
        self._peer_cert_der = peer_cert_der

    async def __call__(
        self, scope: Any, receive: Any, send: Any, sync_spawn: Callable[..., Any], call_soon: Any
    ) -> None:
        extensions = dict(scope.get("extensions") or {})
        extensions[PEER_CERT_KEY] = self._peer_cert_der
        scope = {**scope, "extensions": extensions}
        await self._inner(scope, receive, send, sync_spawn, call_soon)


def _unlink(connection: TCPServer) -> None:
    """Break the reference cycles of a finished connection (its server, protocol, streams
    and TLS objects point at each other), so that it is freed now and not by the cyclic
    garbage collector: about 60 objects a connection, collected in one pause of 40-100 ms
    that lands in the middle of a burst of requests."""
    protocol = vars(connection).pop("protocol", None)
    inner = vars(protocol).pop("protocol", None) if protocol is not None else None
    for held in (connection, protocol, inner):
        if held is not None:
            vars(held).clear()


def peer_cert_der(scope: Any) -> bytes | None:
    value = (scope.get("extensions") or {}).get(PEER_CERT_KEY)
    return value if isinstance(value, bytes) else None


async def serve_https(
    app: Any,
    ssl_context: ssl.SSLContext,
    host: str,
    port: int,
    *,
    authenticated: Callable[[bytes | None], bool] = lambda _: False,
    on_refused: Callable[[], None] = lambda: None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve APP on HOST:PORT until cancelled; started once the port is bound.

    A connection whose client certificate AUTHENTICATED accepts stops counting against
    the limits on unauthenticated ones; ON_REFUSED is called for each connection closed
    at once over those limits.
    """
    config = Config()
    # Also the wait for the first request's headers: hypercorn's idle timer runs from
    # the connection's start until a request's headers are complete.
    # (No read timeout: a client waits silently for a slow answer; Quart bounds bodies.)
    config.keep_alive_timeout = REQUEST_TIMEOUT
    config.h11_max_incomplete_size = MAX_HEADERS_SIZE
    config.ssl_handshake_timeout = HANDSHAKE_TIMEOUT
    config.graceful_timeout = 2
    config.accesslog = None
    admission = Admission(f"management {host}:{port}", on_refused=on_refused)
    wrapper = ASGIWrapper(app)
    context = WorkerContext(None)
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapper, config, lifespan_state)

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        slot = admission.admit(peer_address(stream.transport_stream))
        if slot is None:
            await trio.aclose_forcefully(stream)
            return
        try:
            try:
                with trio.fail_after(HANDSHAKE_TIMEOUT):
                    await stream.do_handshake()
            except (trio.BrokenResourceError, trio.TooSlowError) as e:
                # Foreign or expired client certificates end here, refused by the handshake.
                log.debug("TLS handshake from a client failed: %r", e)
                await trio.aclose_forcefully(stream)
                return
            der = stream.getpeercert(binary_form=True)
            if authenticated(der):
                slot.release()
            connection = TCPServer(
                _WithPeerCert(wrapper, der),
                config,
                context,
                ConnectionState(lifespan_state.copy()),
                _BoundedStream(stream),  # type: ignore[arg-type]
            )
            try:
                await connection.run()
            finally:
                _unlink(connection)
        finally:
            slot.release()
            # Closed here, not only by trio.serve_listeners after us, so that the bound
            # method trio.SSLStream holds of itself (its handshake, run once) can be
            # dropped: a closed SSLStream never runs it again.
            await trio.aclose_forcefully(stream)
            vars(stream).pop("_handshook", None)

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        listeners = await open_tls_listeners(port, ssl_context, host, https_compatible=True)
        async with trio.open_nursery() as server_nursery:
            await server_nursery.start(partial(trio.serve_listeners, handle, listeners))
            task_status.started()
