"""The soak's fault schedule and workload draws (bench/soak_faults.py,
bench/soak_workload.py): the same seed gives the same run, at most one fault a side at
once, none in the warm-up or the quiet end. No servers."""

from __future__ import annotations

import itertools
import random

import pytest

from bench.soak_faults import CONTROL_PLANE, HOLD, KINDS, NODE, plan
from bench.soak_workload import ACTIONS, Action, JobPlan, draw


def test_a_seed_replays_its_schedule() -> None:
    assert plan(7, 3600, 3, 100) == plan(7, 3600, 3, 100)
    assert plan(7, 3600, 3, 100) != plan(8, 3600, 3, 100)


@pytest.mark.parametrize("seed", range(20))
def test_at_most_one_fault_a_side_at_once(seed: int) -> None:
    seconds = 3600.0
    faults = plan(seed, seconds, 3, 100)
    for side in (CONTROL_PLANE, NODE):
        mine = [f for f in faults if f.kind in side]
        for one, after in itertools.pairwise(mine):
            assert after.at >= one.at + one.hold, (one, after)
    assert all(f.at >= 20.0 and f.at + f.hold <= seconds - 30.0 for f in faults)
    assert all(HOLD[f.kind][0] <= f.hold <= HOLD[f.kind][1] for f in faults)


def test_an_hour_sees_every_kind() -> None:
    assert {f.kind for f in plan(44, 3600, 3, 100)} == set(KINDS)


def test_a_short_run_still_sees_many_kinds() -> None:
    assert len({f.kind for f in plan(44, 180, 3, 10)}) >= 5


def test_the_workload_draws_every_kind_and_replays() -> None:
    first = [draw(random.Random(3), 10) for _ in range(5)]
    assert first == [draw(random.Random(3), 10) for _ in range(5)]
    rng = random.Random(1)
    drawn = {d.kind for d in (draw(rng, 10) for _ in range(2000))}
    assert drawn == {k for k, w in ACTIONS.items() if w}
    for _ in range(200):
        made = draw(rng, 10)
        if isinstance(made, JobPlan):
            assert made.bound > 0 and made.body["command"][0] == "sh"
        else:
            assert isinstance(made, Action)


def test_a_hook_without_its_maker_is_refused() -> None:
    with pytest.raises(ValueError, match="file_push"):
        draw(random.Random(1), 10, {**ACTIONS, "file_push": 1})
