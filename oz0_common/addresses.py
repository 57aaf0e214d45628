"""The cluster's well-known ports, and a host as written in an address or a URL.

Written once here for the servers, the agent, the CLI and the tools: the management API
(CLI and web UI) on MANAGEMENT_PORT, nodes' join and control streams on EDGE_PORT
(Temporal's frontend port is the host's own: oz0/temporal/host.py).
"""

from __future__ import annotations

MANAGEMENT_PORT = 8443
EDGE_PORT = 7443


def url_host(host: str) -> str:
    """HOST as written before `:PORT` in an address or a URL: an IPv6 address in brackets."""
    return f"[{host}]" if ":" in host else host


def host_port(host: str, port: int) -> str:
    """`HOST:PORT`, IPv6 as `[ADDRESS]:PORT`."""
    return f"{url_host(host)}:{port}"
