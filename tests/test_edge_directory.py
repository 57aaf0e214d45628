"""The edge list told to nodes does not flap on one late heartbeat."""

from __future__ import annotations

from oz0.server.edge.directory import next_edges

A, B, C = "127.0.0.11:7443", "127.0.0.12:7443", "127.0.0.13:7443"


def test_a_server_comes_in_when_its_heartbeat_is_fresh() -> None:
    assert next_edges([A], up={A, B}, lingering={A, B}, own=A) == [A, B]


def test_a_late_heartbeat_keeps_a_listed_server_listed() -> None:
    # B missed the up window but is within twice it: no news for the nodes.
    assert next_edges([A, B], up={A}, lingering={A, B}, own=A) == [A, B]


def test_a_server_silent_for_twice_the_window_or_gone_leaves() -> None:
    assert next_edges([A, B], up={A}, lingering={A}, own=A) == [A]


def test_a_lingering_server_not_listed_before_does_not_come_in() -> None:
    assert next_edges([A], up={A}, lingering={A, C}, own=A) == [A]


def test_this_server_always_lists_itself_even_when_its_own_heartbeat_is_late() -> None:
    assert next_edges([A, B], up={B}, lingering={B}, own=A) == [A, B]
    assert next_edges([], up=set(), lingering=set(), own=A) == [A]
