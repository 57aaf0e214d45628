"""fixtures/polling.py, which the suite's waits stand on: the first truthy answer comes
back, and a wait that runs out says what it waited for."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import trio
import trio.testing

from fixtures.polling import asyncio_until, seconds_until, trio_until, wait_until


def test_a_wait_returns_the_check_s_first_truthy_answer() -> None:
    answers = iter([None, False, {"ready": True}, {"later": True}])
    assert wait_until(lambda: next(answers), 5, "a ready answer", step=0.01) == {"ready": True}


def test_a_wait_that_runs_out_names_what_it_awaited_and_its_detail() -> None:
    asked = itertools.count()
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: next(asked) < 0, 0.05, "the impossible", step=0.01, detail=lambda: "log")
    assert str(failed.value) == "not within 0.05 s: the impossible\nlog"
    assert next(asked) >= 2  # asked again until the bound, not once


def test_seconds_until_measures_the_wait() -> None:
    assert seconds_until(lambda: True, 5, "at once") < 1


async def test_trio_until_runs_out_on_trio_s_clock(autojump_clock: trio.testing.MockClock) -> None:
    began = trio.current_time()
    with pytest.raises(AssertionError, match=r"^not within 30 s: a change nobody makes$"):
        await trio_until(lambda: False, 30, "a change nobody makes", step=1)
    assert 30 < trio.current_time() - began <= 31


async def test_trio_until_may_ask_in_a_thread() -> None:
    assert await trio_until(lambda: "done", 5, "a blocking check", in_thread=True) == "done"


def test_asyncio_until_returns_and_runs_out() -> None:
    async def both() -> None:
        assert await asyncio_until(lambda: 7, 1, "seven", step=0.01) == 7
        with pytest.raises(AssertionError, match=r"^not within 0.05 s: nothing$"):
            await asyncio_until(lambda: None, 0.05, "nothing", step=0.01)

    asyncio.run(both())
