"""Serve an ASGI app over our own TLS listener, handing the app the peer's certificate.

Hypercorn puts nothing about the client certificate into the ASGI scope, so each
connection is handshaken here, its certificate read from the `trio.SSLStream`, and the
connection then given to hypercorn's `TCPServer` with an app wrapper that adds the
certificate to every scope as `scope["extensions"]["oz0.peer_cert_der"]` (bytes or None).
hypercorn is pinned for this reason.
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

from oz0.server.tls import open_tls_listeners

log = logging.getLogger(__name__)

PEER_CERT_KEY = "oz0.peer_cert_der"
HANDSHAKE_TIMEOUT = 10.0


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


def peer_cert_der(scope: Any) -> bytes | None:
    value = (scope.get("extensions") or {}).get(PEER_CERT_KEY)
    return value if isinstance(value, bytes) else None


async def serve_https(
    app: Any,
    ssl_context: ssl.SSLContext,
    host: str,
    port: int,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve APP on HOST:PORT until cancelled; started once the port is bound."""
    config = Config()
    config.keep_alive_timeout = 30
    config.graceful_timeout = 2
    config.accesslog = None
    wrapper = ASGIWrapper(app)
    context = WorkerContext(None)
    lifespan_state: dict[str, Any] = {}
    lifespan = Lifespan(wrapper, config, lifespan_state)

    async def handle(stream: trio.SSLStream[trio.SocketStream]) -> None:
        try:
            with trio.fail_after(HANDSHAKE_TIMEOUT):
                await stream.do_handshake()
        except (trio.BrokenResourceError, trio.TooSlowError) as e:
            # Foreign or expired client certificates end here, refused by the handshake.
            log.debug("TLS handshake from a client failed: %r", e)
            await trio.aclose_forcefully(stream)
            return
        der = stream.getpeercert(binary_form=True)
        connection = TCPServer(
            _WithPeerCert(wrapper, der),
            config,
            context,
            ConnectionState(lifespan_state.copy()),
            stream,
        )
        await connection.run()

    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        listeners = await open_tls_listeners(port, ssl_context, host, https_compatible=True)
        async with trio.open_nursery() as server_nursery:
            await server_nursery.start(partial(trio.serve_listeners, handle, listeners))
            task_status.started()
