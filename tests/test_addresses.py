"""Addresses as every part writes them (oz0_common/addresses.py): IPv6 in brackets, a bare
host given the edge's port by the agent."""

from __future__ import annotations

import pytest

from oz0_common.addresses import EDGE_PORT, MANAGEMENT_PORT, host_port, url_host
from oz0_node import addresses


@pytest.mark.parametrize(
    ("host", "written"),
    [("127.0.0.1", "127.0.0.1"), ("edge.example", "edge.example"), ("::1", "[::1]")],
)
def test_a_host_is_written_with_an_ipv6_address_in_brackets(host: str, written: str) -> None:
    assert url_host(host) == written
    assert host_port(host, EDGE_PORT) == f"{written}:7443"
    assert host_port(host, MANAGEMENT_PORT) == f"{written}:8443"


@pytest.mark.parametrize(
    ("given", "address"),
    [
        ("10.0.0.1", "10.0.0.1:7443"),
        ("10.0.0.1:9443", "10.0.0.1:9443"),
        ("[fd00::1]", "[fd00::1]:7443"),
        (" [fd00::1]:9443 ", "[fd00::1]:9443"),
    ],
)
def test_the_agent_reads_an_edge_with_or_without_its_port(given: str, address: str) -> None:
    assert addresses.normalise(given) == address


@pytest.mark.parametrize("given", ["fd00::1:7443", "[nothing]:7443", "host:0", "host:x"])
def test_the_agent_refuses_what_is_no_edge_address(given: str) -> None:
    with pytest.raises(ValueError):
        addresses.normalise(given)
