"""Serve an ASGI app over our own TLS listener, handing the app the peer's certificate.

Hypercorn puts nothing about the client certificate into the ASGI scope, so each
connection is handshaken here, its certificate read from the `trio.SSLStream`, and the
connection then given to hypercorn's `TCPServer` with an app wrapper that adds the
certificate to every scope as `scope["extensions"]["oz0.peer_cert_der"]` (bytes or None).
hypercorn is pinned for this reason.

Connections that have not authenticated are admitted within limits (`oz0.server.admission`)
and bounded in time: the TLS handshake, the wait for a request's headers, each read and
each send (hypercorn sends shielded from cancellation, so a peer that never reads would
hold its connection for ever) and the close. A connection authenticates when the app, which
judges each request's certificate anyway (for the management API: the current certificate
of an operator, asked of the database through its cache), calls `authenticated(scope)` for
one of its requests: no second look at the database per connection, and none for a
connection to wait for.

Open connections are known by their client certificate, so that those of a certificate
no longer trusted (its operator removed, or given a new one) can be cut at once
(`Served.cut`); a connection's requests in flight end with it, or, for a certificate
replaced by a new one, are answered first.

An answer given before its request's body came in ends once the rest of the body is read
(`oz0.server.lingering`): closed at once, the connection would be reset under a client
still sending, which could lose the answer.

`Served.drain` stops it gracefully: the listeners close (a new connection is refused),
idle connections close, and each connection closes once its request in flight is
answered (hypercorn's `terminated`, as its own `trio/run.py` shuts down).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState

from oz0.server.admission import Admission, Slot, peer_address
from oz0.server.lingering import LingeringClose
from oz0.server.tls import open_tls_listeners

log = logging.getLogger(__name__)

PEER_CERT_KEY = "oz0.peer_cert_der"
# Called by the app once a request's certificate is found trusted (`authenticated`).
AUTHENTICATED_KEY = "oz0.authenticated"
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


@dataclass(eq=False)
class _Open:
    """One open connection made with a client certificate: its scope (cancelled to cut
    it) and its requests in flight."""

    scope: trio.CancelScope
    requests: int = 0
    # Cut as soon as no request is in flight (Served.cut's AFTER_REQUESTS).
    cut_when_idle: bool = False

    def request_ended(self) -> None:
        self.requests -= 1
        if self.requests == 0 and self.cut_when_idle:
            self.scope.cancel()


@dataclass(eq=False)
class Served:
    """A listener being served: what is in flight on it, and its graceful stop."""

    context: WorkerContext
    accepting: trio.CancelScope = field(default_factory=trio.CancelScope)
    # Requests whose app call has begun and not yet ended, and open connections.
    requests: int = 0
    connections: int = 0
    _changed: trio.lowlevel.ParkingLot = field(default_factory=trio.lowlevel.ParkingLot)
    # The open connections made with each client certificate (DER).
    _by_cert: dict[bytes, set[_Open]] = field(default_factory=dict)

    def connection_ended(self) -> None:
        self.connections -= 1
        self._changed.unpark_all()

    def certificates(self) -> list[bytes]:
        """The client certificates (DER) of the open connections, each once."""
        return list(self._by_cert)

    def cut(self, der: bytes, *, after_requests: bool = False) -> int:
        """End every open connection made with the client certificate DER, and its
        requests in flight, now; returns how many. AFTER_REQUESTS: a connection with
        requests in flight ends once they are answered (the one that renewed the
        certificate must still carry the new one back)."""
        opened = self._by_cert.get(der, set())
        for one in opened:
            if after_requests and one.requests:
                one.cut_when_idle = True
            else:
                one.scope.cancel()
        return len(opened)

    @contextmanager
    def _tracked(self, der: bytes | None) -> Iterator[_Open]:
        with trio.CancelScope() as scope:
            one = _Open(scope)
            if der is None:
                yield one
                return
            self._by_cert.setdefault(der, set()).add(one)
            try:
                yield one
            finally:
                opened = self._by_cert[der]
                opened.discard(one)
                if not opened:
                    del self._by_cert[der]

    async def drain(self) -> None:
        """Refuse new connections, let each one finish the request it is answering (idle
        ones close at once), and return when none is left; the caller bounds the wait."""
        self.accepting.cancel()
        await self.context.terminated.set()
        while self.connections:
            await self._changed.park()


class _WithPeerCert:
    """A hypercorn app wrapper adding one connection's peer certificate to its scopes,
    and counting its requests in flight."""

    def __init__(
        self,
        inner: ASGIWrapper,
        peer_cert_der: bytes | None,
        served: Served,
        one: _Open,
        slot: Slot,
    ) -> None:
        self._inner = inner
        self._peer_cert_der = peer_cert_der
        self._served = served
        self._one = one
        self._slot = slot

    async def __call__(
        self, scope: Any, receive: Any, send: Any, sync_spawn: Callable[..., Any], call_soon: Any
    ) -> None:
        extensions = dict(scope.get("extensions") or {})
        extensions[PEER_CERT_KEY] = self._peer_cert_der
        extensions[AUTHENTICATED_KEY] = self._slot.release
        scope = {**scope, "extensions": extensions}
        self._served.requests += 1
        self._one.requests += 1
        try:
            await self._inner(scope, receive, send, sync_spawn, call_soon)
        finally:
            self._served.requests -= 1
            self._one.request_ended()


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


def authenticated(scope: Any) -> None:
    """The request of SCOPE came with a client certificate trusted now: its connection stops
    counting against the limits on unauthenticated ones."""
    release = (scope.get("extensions") or {}).get(AUTHENTICATED_KEY)
    if release is not None:
        release()


def peer_cert_der(scope: Any) -> bytes | None:
    value = (scope.get("extensions") or {}).get(PEER_CERT_KEY)
    return value if isinstance(value, bytes) else None


async def serve_https(
    app: Any,
    ssl_context: ssl.SSLContext,
    host: str,
    port: int,
    *,
    on_refused: Callable[[], None] = lambda: None,
    task_status: trio.TaskStatus[Served] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve APP on HOST:PORT until cancelled; started, once the port is bound, with the
    `Served` that drains it.

    A connection stops counting against the limits on unauthenticated ones once the app
    calls `authenticated` for one of its requests;
    ON_REFUSED is called for each connection closed at once over those limits.
    """
    config = Config()
    # Also the wait for the first request's headers: hypercorn's idle timer runs from
    # the connection's start until a request's headers are complete.
    # (No read timeout: a client waits silently for a slow answer; Quart bounds bodies.)
    config.keep_alive_timeout = REQUEST_TIMEOUT
    config.h11_max_incomplete_size = MAX_HEADERS_SIZE
    config.ssl_handshake_timeout = HANDSHAKE_TIMEOUT
    config.accesslog = None
    admission = Admission(f"management {host}:{port}", on_refused=on_refused)
    wrapper = ASGIWrapper(LingeringClose(app))
    context = WorkerContext(None)
    served = Served(context)
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapper, config, lifespan_state)

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        served.connections += 1
        try:
            await serve_one(stream)
        finally:
            served.connection_ended()

    async def serve_one(stream: trio.SSLStream[trio.SocketStream]) -> None:
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
            with served._tracked(der) as one:
                connection = TCPServer(
                    _WithPeerCert(wrapper, der, served, one, slot),
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
        # Connections outlive the accepting (cancelled first by a drain, which closes the
        # listeners), so a drain lets them finish.
        async with trio.open_nursery() as connections:

            async def accept(*, task_status: trio.TaskStatus[Any]) -> None:
                with served.accepting:
                    await trio.serve_listeners(
                        handle, listeners, handler_nursery=connections, task_status=task_status
                    )

            await connections.start(accept)
            task_status.started(served)
