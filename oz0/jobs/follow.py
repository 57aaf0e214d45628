"""A long poll of a job's output: read a page, and when it is empty and the job goes on,
wait for the job's next notification (store.tell_followers) and read once more.

The API's GET /api/v1/jobs/<id>/output (`job run`, `job logs --follow`) and the web UI's
live job page read this way, so a follower learns of new output and of the job's end as
it is committed rather than at its next poll. No database connection is held while
waiting: each read is a transaction of its own.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import trio

from oz0.jobs.store import Job, OutputPage
from oz0.store.events import EventHub
from oz0_common.waits import first_of

# The longest wait a request may ask for: a client's read deadline must outlast it, and a
# request in flight holds its connection (not a database one) that long.
MAX_WAIT = 20

P = TypeVar("P")


def version_of(job: Job) -> str:
    """A short digest of the job as a follower is shown it (state, reason, attempts): a
    follower sends back the one it was last given, and a change since is news to it."""
    shown = json.dumps(job.to_json(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(shown.encode()).hexdigest()[:16]


def is_news(job: Job, page: OutputPage, seen: str | None) -> bool:
    """Whether a follower that was shown the job at version SEEN (None: it did not say)
    has something new in JOB and PAGE: output, the job's end, or a change of the job."""
    return bool(page.chunks) or job.ended or (seen is not None and version_of(job) != seen)


@dataclass(frozen=True)
class Answer(Generic[P]):
    page: P
    # Whether the wait asked was honoured (False: no wait asked, none possible, or cut
    # short by the server's stop): a client that asked then waits on its own before it
    # asks again.
    waited: bool


async def read_or_wait(
    hub: EventHub | None,
    job_id: str,
    wait: float,
    read: Callable[[], Awaitable[P]],
    *,
    has_news: Callable[[P], bool],
    stopping: trio.Event,
) -> Answer[P]:
    """READ, and while that finds nothing new (HAS_NEWS false) read again at each of the
    job's notifications (a wake may bring nothing a follower is shown: the job queued
    again for the same reason) until WAIT seconds have passed; at once once STOPPING is
    set (a draining server answers what it has rather than hold its stop)."""
    if wait <= 0 or hub is None or not hub.listening or stopping.is_set():
        return Answer(await read(), waited=False)
    deadline = trio.current_time() + wait
    # Watched before the first read: a commit between that read and the wait wakes it.
    with hub.watch_job(job_id) as watch:
        page = await read()
        while not has_news(page):
            if trio.current_time() >= deadline or stopping.is_set() or not hub.listening:
                break
            with trio.move_on_at(deadline):
                await first_of(watch.wait, stopping.wait)
            page = await read()
    # Cut short by the stop, or by a lost LISTEN connection: not the wait asked for.
    return Answer(page, waited=hub.listening and not stopping.is_set())
