"""Edge addresses: `HOST:PORT` (IPv6 as `[ADDR]:PORT`), as the CLI and the edge spell them."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

from oz0_common.addresses import EDGE_PORT, host_port
from oz0_node.errors import AgentError

_HOSTNAME = re.compile(
    r"[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?(\.[A-Za-z0-9_]([A-Za-z0-9_-]*[A-Za-z0-9_])?)*"
)


def split(address: str) -> tuple[str, int]:
    """HOST (without brackets) and PORT of ADDRESS; ValueError when it is not one."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{address!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)
    elif ":" in host:
        raise ValueError(f"{address!r}: write an IPv6 address as [ADDRESS]:PORT")
    elif not _HOSTNAME.fullmatch(host) or len(host) > 253:
        raise ValueError(f"{address!r} has no valid host name")
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{address!r} has no valid port")
    return host, int(port_text)


def normalise(address: str) -> str:
    """ADDRESS as HOST:PORT; a bare host gets the edge's port."""
    address = address.strip()
    bare_ipv6 = address.startswith("[") and address.endswith("]")
    if bare_ipv6 or ":" not in address:
        address = f"{address}:{EDGE_PORT}"
    host, port = split(address)
    return host_port(host, port)


def parse_cli(values: Iterable[str]) -> list[str]:
    """--edge values (repeated and/or comma-separated) as a list without duplicates."""
    found: list[str] = []
    for value in values:
        for part in value.split(","):
            if not part.strip():
                continue
            try:
                found.append(normalise(part))
            except ValueError as e:
                raise AgentError(f"--edge: {e}") from None
    return list(dict.fromkeys(found))


def merge(known: Iterable[str], new: Iterable[str]) -> list[str]:
    """KNOWN followed by what is new in NEW, in order; addresses that do not parse are dropped."""
    merged = list(known)
    for address in new:
        try:
            address = normalise(address)
        except ValueError:
            continue
        if address not in merged:
            merged.append(address)
    return merged
