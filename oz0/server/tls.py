"""TLS contexts built from keys held in memory.

`SSLContext.load_cert_chain` only takes paths, so the key goes through an anonymous
memory file (memfd): it has a path under /proc/self/fd but never touches a disk.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager

import trio

from oz0.errors import Oz0Error


@contextmanager
def _memory_file(data: bytes) -> Iterator[str]:
    fd = os.memfd_create("oz0-tls", os.MFD_CLOEXEC)
    try:
        os.write(fd, data)
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def load_chain(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """Install (or replace, for renewal) CTX's certificate; later handshakes use it."""
    with _memory_file(cert_pem + key_pem) as path:
        ctx.load_cert_chain(path)


def server_context(
    ca_pem: bytes,
    cert_pem: bytes,
    key_pem: bytes,
    *,
    client_certs: ssl.VerifyMode,
    tickets: int,
) -> ssl.SSLContext:
    """A listener's context; each full TLS 1.3 handshake ends with TICKETS session tickets
    (each costs the handshake about a quarter of a millisecond here: no more than the
    listener's clients resume with)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.verify_mode = client_certs
    ctx.num_tickets = tickets
    ctx.load_verify_locations(cadata=ca_pem.decode())
    load_chain(ctx, cert_pem, key_pem)
    return ctx


async def open_tls_listeners(
    port: int, ssl_context: ssl.SSLContext, host: str, *, https_compatible: bool = False
) -> list[trio.SSLListener[trio.SocketStream]]:
    """Bind HOST:PORT, or fail with one line saying which address could not be had."""
    try:
        return await trio.open_ssl_over_tcp_listeners(
            port, ssl_context, host=host, https_compatible=https_compatible
        )
    except OSError as e:
        raise Oz0Error(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


async def open_tcp_listeners(port: int, host: str) -> list[trio.SocketListener]:
    """Bind HOST:PORT for connections the caller wraps in TLS itself."""
    try:
        return await trio.open_tcp_listeners(port, host=host)
    except OSError as e:
        raise Oz0Error(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
