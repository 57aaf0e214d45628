"""Tell systemd how a `Type=notify` service is doing: sd_notify(3)'s protocol, which is one
datagram of `NAME=VALUE` lines to the unix socket named by $NOTIFY_SOCKET.

No library of ours speaks it (libsystemd's binding would be a compiled dependency for six
lines), so it is written here. A process that systemd did not start has no $NOTIFY_SOCKET,
and every call is then nothing. A failed send is logged once and never stops the caller:
systemd then ends the unit at its start timeout, which says what went wrong.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger(__name__)

ENV_VAR = "NOTIFY_SOCKET"
# A datagram to a unix socket whose reader is slow waits for room; never this long.
SEND_TIMEOUT = 1.0


class Notifier:
    """Where to send; None when systemd did not ask (or asked on a socket we cannot use)."""

    def __init__(self, address: str | bytes | None) -> None:
        self.address = address
        self._failed = False

    @classmethod
    def from_env(cls) -> Notifier:
        """The notifier $NOTIFY_SOCKET names, taken out of the environment: the processes
        this one starts (the Temporal host, dev mode's PostgreSQL) must not inherit it and
        speak for the service."""
        return cls(parse_address(os.environ.pop(ENV_VAR, "")))

    def notify(self, *fields: str) -> bool:
        """Send FIELDS (such as "READY=1") in one datagram; whether it was sent."""
        if self.address is None:
            return False
        message = "\n".join(fields).encode()
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                sock.settimeout(SEND_TIMEOUT)
                sock.sendto(message, self.address)
        except OSError as e:
            if not self._failed:
                self._failed = True
                log.warning("cannot notify systemd on %s: %s", self.address, e.strerror or e)
            return False
        return True


def parse_address(text: str) -> str | bytes | None:
    """A socket path, or an abstract socket ('@' then its name); None for none, or for a
    kind we do not speak (vsock: only a VM's guest uses it)."""
    if text.startswith("/"):
        return text
    if text.startswith("@") and len(text) > 1:
        return b"\0" + text[1:].encode()
    if text:
        log.warning("ignoring %s=%r: not a unix socket path or abstract name", ENV_VAR, text)
    return None
