"""The soak's fault schedule and workload draws (bench/soak_faults.py,
bench/soak_workload.py): the same seed gives the same run, at most one fault a side at
once, none in the warm-up or the quiet end. No servers."""

from __future__ import annotations

import itertools
import random

import pytest

from bench.soak_faults import CONTROL_PLANE, HOLD, KINDS, NODE, plan
from bench.soak_workload import ACTIONS, Action, JobPlan, SessionPlan, draw
from oz0_common.file_push import PUSH, PushOrder


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
            assert made.bound > 0 and made.body["command"][0] in ("sh", PUSH)
        elif isinstance(made, SessionPlan):
            assert made.bound > 0 and made.command[0] == "sh"
        else:
            assert isinstance(made, Action)


def test_files_are_placed_and_pushed_as_drawn() -> None:
    """A `job_file` job names its file and prints its SHA-256 alone; a push's command is
    the push of that content, to a group, under its own name; the content replays."""
    rng = random.Random(5)
    only = {"job_file": 1, "file_push": 1}
    drawn = [draw(rng, 10, only) for _ in range(20)]
    placed = [d for d in drawn if isinstance(d, JobPlan) and d.kind == "job_file"]
    pushed = [d for d in drawn if isinstance(d, JobPlan) and d.kind == "file_push"]
    assert placed and pushed
    for job in placed:
        assert job.file is not None and job.ledgered
        assert job.body["files"] == [
            {"sha256": job.file.sha256, "size": job.file.size, "name": job.file.name}
        ]
        assert job.expect == f"{job.file.sha256}\n".encode()
        assert len(job.file.data()) == job.file.size and job.file.data() == job.file.data()
    for job in pushed:
        assert job.file is not None and not job.ledgered and job.body["all"] is True
        order = PushOrder.of(job.body["command"])
        assert order is not None
        assert (order.sha256, order.size, order.dest) == (
            job.file.sha256, job.file.size, job.file.name
        )  # fmt: skip


def test_a_kind_the_workload_does_not_know_is_refused() -> None:
    with pytest.raises(ValueError, match="file_pull"):
        draw(random.Random(1), 10, {**ACTIONS, "file_pull": 1})
