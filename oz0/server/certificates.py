"""This server's own certificates: issued at start, renewed daily, never written to disk."""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from oz0 import pki
from oz0.cluster import Cluster
from oz0.server import tls

log = logging.getLogger(__name__)

RENEW_EVERY = 24 * 3600.0


@dataclass
class ServerCertificates:
    """The key and certificates one server process holds, and the TLS contexts using them."""

    cluster: Cluster
    server_id: str
    sans: tuple[str, ...]
    key_pem: bytes = b""
    cert_pem: bytes = b""
    internode_cert_pem: bytes = b""
    contexts: list[ssl.SSLContext] = field(default_factory=list)
    # Called after each renewal, for holders of the PEMs outside this process's TLS contexts.
    on_renew: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.issue()

    def issue(self, now: dt.datetime | None = None) -> None:
        key = pki.new_private_key()
        cert = self.cluster.cluster_ca.issue(
            key.public_key(),
            name=self.server_id,
            role=pki.Role.SERVER,
            validity=pki.SERVER_VALIDITY,
            sans=self.sans,
            server=True,
            client=True,
            now=now,
        )
        internode = self.cluster.internode_ca.issue(
            key.public_key(),
            name=self.server_id,
            role=pki.Role.SERVER,
            validity=pki.SERVER_VALIDITY,
            sans=self.sans,
            server=True,
            client=True,
            now=now,
        )
        self.key_pem = pki.key_to_pem(key)
        self.cert_pem = pki.cert_to_pem(cert)
        self.internode_cert_pem = pki.cert_to_pem(internode)
        for ctx in self.contexts:
            tls.load_chain(ctx, self.cert_pem, self.key_pem)

    def server_context(self, client_certs: ssl.VerifyMode, *, tickets: int) -> ssl.SSLContext:
        """A TLS context for a listener of this server, kept current on renewal."""
        ctx = tls.server_context(
            self.cluster.ca_pem,
            self.cert_pem,
            self.key_pem,
            client_certs=client_certs,
            tickets=tickets,
        )
        self.contexts.append(ctx)
        return ctx

    def temporal_tls(self) -> dict[str, str]:
        """The PEMs the Temporal host needs, in its configuration's shape."""
        return {
            "clusterCA": self.cluster.ca_pem.decode(),
            "frontendCert": self.cert_pem.decode(),
            "frontendKey": self.key_pem.decode(),
            "internodeCA": pki.cert_to_pem(self.cluster.internode_ca.cert).decode(),
            "internodeCert": self.internode_cert_pem.decode(),
            "internodeKey": self.key_pem.decode(),
        }

    async def renew_forever(self, every: float = RENEW_EVERY) -> None:
        while True:
            await trio.sleep(every)
            self.issue()
            log.info("renewed this server's certificates")
            for hook in self.on_renew:
                await hook()
