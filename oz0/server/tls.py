"""TLS contexts built from keys held in memory.

`SSLContext.load_cert_chain` only takes paths, so the key goes through an anonymous
memory file (memfd): it has a path under /proc/self/fd but never touches a disk.

The management port (8443) serves two kinds of client with one listener, and shows each
the certificate it can verify, chosen by the server name the client sends (SNI,
`by_server_name`):

- our own clients (the CLI, `cli/client.py`) send the fixed name `API_SERVER_NAME` and get
  the server's certificate from the cluster CA, which they pin (they check its role and
  cluster, not a host name: a context may name a server by any address);
- everything else, a browser above all, gets the web UI's certificate: one from the
  cluster's name-constrained UI CA (oz0/cluster.py), or the organisation's own
  (`server start --ui-cert/--ui-key`).

The choice has to be by a name our clients send, not by its absence: a browser sends no
server name when it reaches a server by an IP address (RFC 6066 allows only host names),
just as Python's `ssl` does for an IP literal, so "no name" cannot tell the two apart. A
name under `.invalid` (RFC 6761) never resolves, so no browser ever sends it for a real
site. Nodes never connect to 8443 (the edge, 7443, keeps the cluster certificate alone);
the agent file download there checks the file's SHA-256, not the certificate.
"""

from __future__ import annotations

import datetime as dt
import os
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from oz0.errors import Oz0Error
from oz0_common.certs import API_SERVER_NAME, read_private, utcnow

__all__ = ["API_SERVER_NAME", "UiPair", "by_server_name", "read_ui_pair"]


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


def by_server_name(default: ssl.SSLContext, api: ssl.SSLContext) -> ssl.SSLContext:
    """DEFAULT, switching a handshake to API when the client names `API_SERVER_NAME`.

    Both must verify client certificates alike: OpenSSL keeps the verify mode of the
    context a handshake began with, and takes the trusted CAs of the one it ends with."""

    def choose(tls: ssl.SSLObject | ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
        if name == API_SERVER_NAME:
            tls.context = api

    default.sni_callback = choose
    return default


@dataclass(frozen=True)
class UiPair:
    """An organisation's certificate (with its chain) and key for the web UI."""

    cert_pem: bytes
    key_pem: bytes
    names: tuple[str, ...]
    not_after: dt.datetime


def read_ui_pair(cert_path: Path, key_path: Path) -> UiPair:
    """The web UI's certificate chain and key from `--ui-cert`/`--ui-key`, checked now so that a
    bad pair stops the start with one line rather than failing browsers' handshakes."""
    key_pem = read_private(key_path, "--ui-key file", Oz0Error)
    try:
        cert_pem = cert_path.read_bytes()
    except OSError as e:
        raise Oz0Error(f"cannot read --ui-cert file {cert_path}: {e.strerror or e}") from None
    try:
        chain = x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        raise Oz0Error(f"--ui-cert file {cert_path} holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise Oz0Error(
            f"--ui-key file {key_path} holds no PEM private key (or one with a passphrase)"
        ) from None
    leaf = chain[0]
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(
        serialization.Encoding.DER, public
    ) != leaf.public_key().public_bytes(serialization.Encoding.DER, public):
        raise Oz0Error(
            f"--ui-key file {key_path} is not the key of the certificate in {cert_path} "
            "(the first certificate there must be the server's, followed by its chain)"
        )
    if leaf.not_valid_after_utc <= utcnow():
        raise Oz0Error(
            f"--ui-cert {cert_path} expired on {leaf.not_valid_after_utc:%Y-%m-%d %H:%M} UTC"
        )
    try:
        sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise Oz0Error(
            f"--ui-cert {cert_path} names no host (no subjectAltName): browsers refuse it"
        ) from None
    names = tuple(
        [*sans.get_values_for_type(x509.DNSName)]
        + [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)]
    )
    pair = UiPair(
        cert_pem=cert_pem, key_pem=key_pem, names=names, not_after=leaf.not_valid_after_utc
    )
    # What OpenSSL itself makes of them (a key type it cannot serve, say).
    try:
        load_chain(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert_pem, key_pem)
    except ssl.SSLError as e:
        raise Oz0Error(f"--ui-cert {cert_path} with --ui-key {key_path}: {e.reason or e}") from None
    return pair


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
