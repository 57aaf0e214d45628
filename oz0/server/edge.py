"""The edge role on 7443: TLS with a certificate from the cluster CA, websockets for nodes.

Nodes without a certificate yet (joining) and nodes with one (control streams) share the
port, so client certificates are optional at the handshake and checked per endpoint.
This first version greets every websocket with the cluster's name and CA certificate,
which a joining node pins by its hash; join and control streams build on it.
"""

from __future__ import annotations

import json
import logging
import ssl
from functools import partial

import trio
from trio_websocket import ConnectionClosed, WebSocketRequest, wrap_server_stream

from oz0.cluster import Cluster
from oz0.server.tls import open_tls_listeners

log = logging.getLogger(__name__)

EDGE_PORT = 7443
HANDSHAKE_TIMEOUT = 10.0


async def run(
    cluster: Cluster,
    tls_context: ssl.SSLContext,
    host: str,
    port: int = EDGE_PORT,
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    listeners = await open_tls_listeners(port, tls_context, host)
    async with trio.open_nursery() as nursery:
        await nursery.start(partial(trio.serve_listeners, partial(_handle, cluster), listeners))
        task_status.started()


async def _handle(cluster: Cluster, stream: trio.SSLStream[trio.SocketStream]) -> None:
    try:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            await stream.do_handshake()
            async with trio.open_nursery() as nursery:
                request: WebSocketRequest = await wrap_server_stream(nursery, stream)
                ws = await request.accept()
                await ws.send_message(
                    json.dumps(
                        {
                            "type": "hello",
                            "cluster": cluster.name,
                            "ca_hash": cluster.ca_hash,
                            "ca_pem": cluster.ca_pem.decode(),
                        }
                    )
                )
                await ws.aclose()
    except (trio.BrokenResourceError, trio.TooSlowError, ConnectionClosed) as e:
        log.debug("edge connection ended early: %r", e)
    finally:
        await trio.aclose_forcefully(stream)
