"""Whether this server's own listening ports can be had, asked before its roles start.

A server binds its management API and its edge only once its database pool, membership and
Temporal host are up: seconds on an idle machine, more on a loaded one. A port another
process held was then told only after all of that had started and stopped again. `check`
binds each port as the listeners will (SO_REUSEADDR, every address HOST resolves to) and
lets it go at once, so `server start` answers in a moment. It is asked after the master
key and the database's schema are checked (`prepare`), whose refusals come first. The
listeners' own bind still says the same if the port is taken in between (oz0/server/tls.py).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable

from oz0.errors import Oz0Error


def check(host: str, ports: Iterable[int]) -> None:
    """Raise Oz0Error, in the listeners' words, for the first of PORTS on HOST that is taken."""
    for port in ports:
        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except socket.gaierror as e:
            raise Oz0Error(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
        for family, kind, proto, _, address in found:
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    # As trio's listeners: an IPv6 socket holds only IPv6.
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
                try:
                    probe.bind(address)
                except OSError as e:
                    raise Oz0Error(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
