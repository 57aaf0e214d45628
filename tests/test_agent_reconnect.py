"""The reconnect policy on Trio's MockClock: exact waits, jitter, the 5 s cap, rotation."""

from __future__ import annotations

import itertools
import random

import pytest
import trio
import trio.testing

from fixtures.fake_edges import LongestWait
from oz0_node.reconnect import Reconnect


async def _attempts(policy: Reconnect, count: int) -> list[tuple[str, float]]:
    start = trio.current_time()
    made = []
    for _ in range(count):
        edge = await policy.next_edge()
        made.append((edge, trio.current_time() - start))
    return made


async def test_waits_double_from_a_fifth_of_a_second_up_to_five_and_rotate_edges(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1", "b:2", "c:3"], rng=LongestWait())
    made = await _attempts(policy, 9)
    waits = [0.0, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0, 5.0]
    expected_times = [sum(waits[: i + 1]) for i in range(len(waits))]
    assert [edge for edge, _ in made] == ["a:1", "b:2", "c:3"] * 3
    assert [t for _, t in made] == pytest.approx(expected_times)


async def test_waits_are_jittered_and_never_longer_than_five_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1"], rng=random.Random(7))
    made = await _attempts(policy, 200)
    times = [t for _, t in made]
    waits = [later - earlier for earlier, later in itertools.pairwise(times)]
    bounds = [min(5.0, 0.2 * 2**i) for i in range(len(waits))]
    assert all(0 <= wait <= bound + 1e-9 for wait, bound in zip(waits, bounds, strict=True))
    assert max(waits) <= 5.0
    # Full jitter: waits spread over [0, bound], they do not sit at the bound.
    capped = waits[10:]
    assert min(capped) < 1.0 and max(capped) > 4.0
    assert len({round(w, 6) for w in capped}) == len(capped)


async def test_a_stream_up_thirty_seconds_resets_the_backoff(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1"], rng=LongestWait())
    await _attempts(policy, 8)
    assert policy.delay_bound() == 5.0

    policy.stream_up()
    await trio.sleep(29.9)
    policy.stream_down()
    assert policy.delay_bound() == 5.0

    policy.stream_up()
    await trio.sleep(30)
    policy.stream_down()
    before = trio.current_time()
    await policy.next_edge()
    assert trio.current_time() - before == pytest.approx(0.2)


async def test_edges_learnt_later_join_the_rotation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    known = ["a:1"]
    policy = Reconnect(lambda: known, rng=LongestWait())
    assert await policy.next_edge() == "a:1"
    known.extend(["b:2", "c:3"])
    assert [await policy.next_edge() for _ in range(3)] == ["b:2", "c:3", "a:1"]


async def test_an_edge_that_refused_is_asked_again_every_two_to_four_seconds(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1", "b:2"], rng=random.Random(3))
    await policy.next_edge()
    waits = []
    for _ in range(200):
        policy.same_edge_again()
        before = trio.current_time()
        assert await policy.next_edge() == "a:1"
        waits.append(trio.current_time() - before)
    assert all(2.0 <= wait <= 4.0 for wait in waits)
    assert min(waits) < 2.2 and max(waits) > 3.8, "spread over the range, not one value"
    # A failure that is not a refusal goes back to the backoff (and to the next edge).
    before = trio.current_time()
    assert await policy.next_edge() == "b:2"
    assert trio.current_time() - before <= 5.0


async def test_agents_that_lose_one_edge_spread_over_the_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A server dies: its agents must not all move to the edge after it in the list."""
    edges = ["a:1", "b:2", "c:3", "d:4"]
    went_to = []
    for seed in range(200):
        policy = Reconnect(lambda: edges, rng=random.Random(seed))
        assert [await policy.next_edge() for _ in range(3)] == ["a:1", "b:2", "c:3"]
        policy.elsewhere()  # c:3 went away
        went_to.append(await policy.next_edge())
    counts = {edge: went_to.count(edge) for edge in edges}
    assert counts["c:3"] == 0
    assert all(40 <= counts[e] <= 95 for e in ("a:1", "b:2", "d:4")), counts


async def test_with_two_edges_elsewhere_is_the_other_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1", "b:2"], rng=random.Random(1))
    assert await policy.next_edge() == "a:1"
    for _ in range(5):
        policy.elsewhere()
        assert await policy.next_edge() == "b:2"
        policy.elsewhere()
        assert await policy.next_edge() == "a:1"


async def test_a_move_goes_to_another_edge_at_once_however_long_the_backoff_had_grown(
    autojump_clock: trio.testing.MockClock,
) -> None:
    edges = ["a:1", "b:2", "c:3"]
    went_to = set()
    for seed in range(50):
        policy = Reconnect(lambda: edges, rng=random.Random(seed))
        for _ in range(8):  # failures: the next wait could be up to 5 s
            await policy.next_edge()
        leaving = edges[7 % 3]  # the one the eighth attempt reached ...
        policy.stream_up()
        policy.stream_down()
        policy.move_now(leaving)  # ... asks it to move
        before = trio.current_time()
        moved_to = await policy.next_edge()
        assert trio.current_time() == before
        assert moved_to != leaving
        went_to.add(moved_to)
        # Only the one attempt: after it, the backoff is where it was.
        assert policy.delay_bound() == 5.0
    assert went_to == {"a:1", "c:3"}


async def test_a_move_from_the_only_known_edge_tries_it_again_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    policy = Reconnect(lambda: ["a:1"], rng=LongestWait())
    for _ in range(4):
        await policy.next_edge()
    policy.move_now("a:1")
    before = trio.current_time()
    assert await policy.next_edge() == "a:1"
    assert trio.current_time() == before
