"""The long poll of a job's output without a server (oz0/jobs/follow.py over the hub's job
watches, oz0/store/events.py), on Trio's autojump clock: what wakes it, when it answers,
and that it says whether it waited. The same with a real server: test_job_follow_told.py."""

from __future__ import annotations

import trio
import trio.testing

from oz0.jobs.follow import Answer, read_or_wait
from oz0.store.events import JOBS, NODES, EventHub
from oz0.store.listen import Notification

JOB = "job-0123456789ab"
OTHER = "job-ba9876543210"
WAIT = 20


class Job:
    """What the reads see: a list of pages, the last repeated; each read is counted."""

    def __init__(self, *pages: str) -> None:
        self.pages = list(pages)
        self.reads = 0

    async def read(self) -> str:
        self.reads += 1
        return self.pages.pop(0) if len(self.pages) > 1 else self.pages[0]


def listening_hub() -> EventHub:
    hub = EventHub("")
    hub.listening = True
    return hub


def news(page: str) -> bool:
    return page != "nothing"


async def poll(hub: EventHub, job: Job, stopping: trio.Event, wait: float = WAIT) -> Answer[str]:
    return await read_or_wait(hub, JOB, wait, job.read, has_news=news, stopping=stopping)


async def test_news_at_the_first_read_is_answered_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    job = Job("output")
    answer = await poll(listening_hub(), job, trio.Event())
    assert answer == Answer("output", waited=True) and job.reads == 1
    assert trio.current_time() == 0


async def test_the_job_s_notification_wakes_the_wait_and_others_do_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = listening_hub()
    job = Job("nothing", "nothing", "ended")
    answers: list[Answer[str]] = []

    async def told() -> None:
        await trio.sleep(3)
        hub._dispatch(Notification(JOBS, OTHER))  # another job's: no read
        hub._dispatch(Notification(NODES, JOB))  # another channel's
        await trio.sleep(1)
        hub._dispatch(Notification(JOBS, JOB))  # a wake with nothing new: waits on
        await trio.sleep(1)
        hub._dispatch(Notification(JOBS, JOB))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(told)
        answers.append(await poll(hub, job, trio.Event()))
    assert answers == [Answer("ended", waited=True)]
    assert trio.current_time() == 5 and job.reads == 3
    assert not hub._job_watches  # unwatched once answered


async def test_a_commit_between_the_first_read_and_the_wait_is_not_missed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = listening_hub()
    pages = iter(["nothing", "output"])

    async def read() -> str:
        page = next(pages)
        if page == "nothing":
            # Committed (and notified) while the first read's answer is on its way.
            hub._dispatch(Notification(JOBS, JOB))
        return page

    answer = await read_or_wait(hub, JOB, WAIT, read, has_news=news, stopping=trio.Event())
    assert answer == Answer("output", waited=True)
    assert trio.current_time() == 0


async def test_without_news_it_answers_at_the_deadline_having_waited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    job = Job("nothing")
    answer = await poll(listening_hub(), job, trio.Event())
    assert answer == Answer("nothing", waited=True)
    assert trio.current_time() == WAIT and job.reads == 2


async def test_a_gap_wakes_it_to_read(autojump_clock: trio.testing.MockClock) -> None:
    hub = listening_hub()
    job = Job("nothing", "output")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _later(2, hub._gap))
        answer = await poll(hub, job, trio.Event())
    assert answer == Answer("output", waited=True) and trio.current_time() == 2


async def test_a_lost_listen_connection_ends_the_wait_and_says_it_did_not_wait(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = listening_hub()
    job = Job("nothing")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _later(2, hub._lost))
        answer = await poll(hub, job, trio.Event())
    assert answer == Answer("nothing", waited=False) and trio.current_time() == 2
    # Until it listens again, nobody waits for news that cannot come.
    assert await poll(hub, job, trio.Event()) == Answer("nothing", waited=False)
    assert trio.current_time() == 2


async def test_the_server_s_stop_answers_the_wait_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    hub = listening_hub()
    job = Job("nothing")
    stopping = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _later(3, stopping.set))
        answer = await poll(hub, job, stopping)
    assert answer == Answer("nothing", waited=False) and trio.current_time() == 3
    # A request that comes while it stops does not wait at all.
    assert await poll(hub, job, stopping) == Answer("nothing", waited=False)
    assert trio.current_time() == 3


async def test_no_wait_asked_or_no_hub_reads_once_and_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    job = Job("nothing")
    assert await poll(listening_hub(), job, trio.Event(), wait=0) == Answer("nothing", False)
    answer = await read_or_wait(None, JOB, WAIT, job.read, has_news=news, stopping=trio.Event())
    assert answer == Answer("nothing", waited=False)
    assert trio.current_time() == 0 and job.reads == 2


async def _later(seconds: float, call: object) -> None:
    await trio.sleep(seconds)
    assert callable(call)
    call()
