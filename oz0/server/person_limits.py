"""What one person may hold or ask of this server: web sessions (counted cluster-wide),
live pages, event streams and requests a second (this server's own), from `server
start`'s flags.

Requests: a token bucket per person (by name: an operator's certificate and its web
session share one), REQUEST_BURST tokens refilled at REQUESTS_PER_SECOND; every request of
the CLI's API and every web UI page or action of a signed-in person takes one, and one
that finds none is refused 429 with `Retry-After`, before its handler runs. Another
person's requests are not slowed: each has its own bucket. The buckets are this server's
(a person may send as much to each server) and bounded: at most MAX_PEOPLE, the least
recently used forgotten beyond (its person starts again with a full bucket, no more than
a burst). No library: `limits` and `aiolimiter` are asyncio's or count windows in
timers of their own; this is twenty lines on Trio's clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field

from oz0 import cap_rules
from oz0.server_defaults import (
    MAX_EVENT_STREAMS_PER_PERSON,
    MAX_LIVE_PAGES_PER_PERSON,
    MAX_WEB_SESSIONS_PER_PERSON,
    PERSON_REQUEST_BURST,
    PERSON_REQUESTS_PER_SECOND,
)

# People whose buckets a server keeps; beyond, the least recently used is forgotten.
MAX_PEOPLE = 4096


class RequestBuckets:
    """A token bucket per person: RATE tokens a second, at most BURST; time is given (a
    Trio clock's), so a test moves it."""

    def __init__(self, rate: float, burst: int, max_people: int = MAX_PEOPLE) -> None:
        self.rate = rate
        self.burst = burst
        self.max_people = max_people
        # person -> (tokens, when they were counted); least recently used first.
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._buckets)

    def take(self, person: str, now: float) -> float:
        """Take one token of PERSON's at NOW: 0 if there was one, else how many seconds
        until there is (nothing taken)."""
        tokens, then = self._buckets.pop(person, (float(self.burst), now))
        tokens = min(float(self.burst), tokens + max(0.0, now - then) * self.rate)
        wait = 0.0
        if tokens >= 1:
            tokens -= 1
        else:
            wait = (1 - tokens) / self.rate
        self._buckets[person] = (tokens, now)
        while len(self._buckets) > self.max_people:
            self._buckets.popitem(last=False)
        return wait


@dataclass(frozen=True)
class PersonLimits:
    """This server's caps on one person (`server start` flags) and its request buckets."""

    web_sessions: int = MAX_WEB_SESSIONS_PER_PERSON
    live_pages: int = MAX_LIVE_PAGES_PER_PERSON
    requests_per_second: float = PERSON_REQUESTS_PER_SECOND
    request_burst: int = PERSON_REQUEST_BURST
    # Streams of the audit log (oz0/server/audit_follow.py).
    event_streams: int = MAX_EVENT_STREAMS_PER_PERSON
    buckets: RequestBuckets = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        buckets = RequestBuckets(self.requests_per_second, self.request_burst)
        object.__setattr__(self, "buckets", buckets)

    def take_request(self, person: str, now: float) -> None:
        """One request of PERSON's at NOW; CapReached (429, its wait) past the rate."""
        wait = self.buckets.take(person, now)
        if wait > 0:
            raise cap_rules.too_many_requests(
                person, self.requests_per_second, self.request_burst, wait
            )
