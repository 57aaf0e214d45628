"""This server's own certificates: issued at start, renewed daily, never written to disk.

Besides its certificates from the cluster CA (the API, the edge, Temporal) and the
internode CA, a server holds one from the web UI's CA for browsers on 8443, for those of
its names the UI CA's name constraints permit, unless it serves an organisation's own
certificate (`server start --ui-cert/--ui-key`). `management_context` puts both on one
listener; oz0/server/tls.py says how a handshake gets one or the other.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
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
    # The organisation's certificate for browsers, if given; else the UI CA issues one.
    ui_pair: tls.UiPair | None = None
    # This server's certificate from the UI CA, for UI_NAMES; empty without a UI CA.
    ui_cert_pem: bytes = b""
    ui_names: tuple[str, ...] = ()
    contexts: list[ssl.SSLContext] = field(default_factory=list)
    ui_contexts: list[ssl.SSLContext] = field(default_factory=list)
    # Called after each renewal, for holders of the PEMs outside this process's TLS contexts
    # (told_of_renewals).
    _on_renew: list[Callable[[], Awaitable[None]]] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        if self.ui_pair is not None:
            # Read once, at start: the log says until when it serves.
            log.info(
                "serving browsers the organisation's certificate for %s, valid until %s",
                ", ".join(self.ui_pair.names),
                f"{self.ui_pair.not_after:%Y-%m-%d %H:%M} UTC",
            )
        ui_ca = self.cluster.ui_ca
        if self.ui_pair is None and ui_ca is not None:
            inside, outside = pki.permitted_names(ui_ca.cert, self.sans)
            self.ui_names = tuple(inside)
            if outside:
                # A browser refuses a whole certificate one of whose names breaks the
                # constraints: those names are left out, and browsers must use the others.
                log.warning(
                    "the web UI CA of cluster %s is not good for %s (its name constraints "
                    "permit only names the cluster had when it was made): browsers reaching "
                    "this server by %s get a certificate they cannot trust; reach it by %s, "
                    "or serve your organisation's certificate with --ui-cert/--ui-key",
                    self.cluster.name,
                    ", ".join(outside),
                    "that" if len(outside) == 1 else "those",
                    ", ".join(inside) or "no name of it (none is permitted)",
                )
        self.issue()

    def issue(self, now: dt.datetime | None = None) -> None:
        key = pki.new_private_key()
        cert = self.cluster.cluster_ca.issue(
            key.public_key(),
            name=self.server_id,
            role=pki.Role.SERVER,
            validity=pki.SERVER_VALIDITY,
            # Also the name our clients send on 8443, so that a client checking host names
            # (curl --cacert with the context's CA, say) can verify it by that name too.
            sans=(*self.sans, tls.API_SERVER_NAME),
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
        ui_ca = self.cluster.ui_ca
        if self.ui_pair is None and ui_ca is not None:
            ui_cert = ui_ca.issue(
                key.public_key(),
                name=self.server_id,
                role=pki.Role.SERVER,
                validity=pki.SERVER_VALIDITY,
                sans=self.ui_names,
                server=True,
                client=False,
                now=now,
            )
            self.ui_cert_pem = pki.cert_to_pem(ui_cert)
        for ctx in self.contexts:
            tls.load_chain(ctx, self.cert_pem, self.key_pem)
        for ctx in self.ui_contexts:
            tls.load_chain(ctx, self.ui_cert_pem, self.key_pem)

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

    def management_context(self, *, tickets: int) -> ssl.SSLContext:
        """The management listener's context: the web UI's certificate for browsers, this
        server's cluster-CA one for our clients (by server name, oz0/server/tls.py); both
        take operator certificates alike (optional: the web UI signs in with a password)."""
        api = self.server_context(ssl.CERT_OPTIONAL, tickets=tickets)
        if self.ui_pair is not None:
            cert_pem, key_pem = self.ui_pair.cert_pem, self.ui_pair.key_pem
        elif self.ui_cert_pem:
            cert_pem, key_pem = self.ui_cert_pem, self.key_pem
        else:
            return api  # a cluster without a UI CA (never one `server start` prepared)
        ui = tls.server_context(
            self.cluster.ca_pem, cert_pem, key_pem, client_certs=ssl.CERT_OPTIONAL, tickets=tickets
        )
        if self.ui_pair is None:
            self.ui_contexts.append(ui)
        return tls.by_server_name(ui, api)

    @contextmanager
    def told_of_renewals(self, hook: Callable[[], Awaitable[None]]) -> Iterator[None]:
        """HOOK awaited after each renewal until the block ends, however it ends."""
        self._on_renew.append(hook)
        try:
            yield
        finally:
            self._on_renew.remove(hook)

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
            for hook in list(self._on_renew):
                await hook()
