"""Admission of connections that have not proven who they are yet (7443 and 8443).

Anyone can open a TCP connection, so what an unauthenticated peer can hold is bounded:
each listener admits at most `MAX_PER_ADDRESS` such connections from one source address
and `MAX_TOTAL` in all. One over the cap is closed at once, before its TLS handshake costs
anything. Refusals are counted (`on_refused` tells `/metrics` of each) and logged at most
once per `LOG_EVERY` seconds, so a flood cannot fill the log. A connection that
authenticates (a certificate of the cluster on a control stream, an operator's current
certificate on 8443: not one replaced, nor one of an operator removed) gives its place back.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

log = logging.getLogger(__name__)

MAX_PER_ADDRESS = 64
MAX_TOTAL = 2048
LOG_EVERY = 60.0


@dataclass
class Admission:
    """The unauthenticated connections of one listener, by source address."""

    listener: str
    per_address: int = MAX_PER_ADDRESS
    total: int = MAX_TOTAL
    log_every: float = LOG_EVERY
    on_refused: Callable[[], None] = lambda: None
    refused: int = 0
    _by_address: dict[str, int] = field(default_factory=dict)
    _held: int = 0
    _unlogged: int = 0
    _logged_at: float = -math.inf

    @property
    def held(self) -> int:
        return self._held

    def admit(self, address: str) -> Slot | None:
        """A place for a new connection from ADDRESS, or None if it must be closed."""
        if self._held >= self.total or self._by_address.get(address, 0) >= self.per_address:
            self._refuse(address)
            return None
        self._by_address[address] = self._by_address.get(address, 0) + 1
        self._held += 1
        return Slot(self, address)

    def _give_back(self, address: str) -> None:
        self._held -= 1
        left = self._by_address[address] - 1
        if left:
            self._by_address[address] = left
        else:
            del self._by_address[address]

    def _refuse(self, address: str) -> None:
        self.refused += 1
        self.on_refused()
        self._unlogged += 1
        now = trio.current_time()
        if now - self._logged_at >= self.log_every:
            log.warning(
                "%s: closed %d unauthenticated connection(s) over the limit (%d per address,"
                " %d in total) since the last report; the latest from %s",
                self.listener,
                self._unlogged,
                self.per_address,
                self.total,
                address,
            )
            self._unlogged = 0
            self._logged_at = now


@dataclass
class Slot:
    """One admitted connection's place; `release` (idempotent) gives it back."""

    admission: Admission
    address: str
    _released: bool = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.admission._give_back(self.address)


def peer_address(stream: trio.SocketStream) -> str:
    """The source address of an accepted connection (its port left out)."""
    try:
        peer = stream.socket.getpeername()
    except OSError:
        # Gone before we looked: counted under one name, and closed soon enough.
        return "unknown"
    return str(peer[0]) if isinstance(peer, tuple) else str(peer)
