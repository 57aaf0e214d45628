"""When and where to try next: exponential backoff with full jitter across every known edge.

Each attempt goes to the next edge in turn, unless the last one answered and is asked
again (`same_edge_again`: a refusal is an answer, and any edge would give the same), or
could not be reached or was lost (`elsewhere`: then one of the others, at random). The
first attempt of a policy is immediate; after that the wait before attempt n (n = attempts
since the last reset) is uniform in [0, min(CAP, BASE * 2**n)]: 0.2 s, 0.4 s, ... never
more than 5 s. A stream that stayed up STABLE_AFTER seconds resets the count. Time is
Trio's clock, so tests run it on MockClock.

An edge that refused us for now (blocked) is asked again after a wait uniform in
[REFUSED_MIN, REFUSED_MAX] instead: on average no more often than full jitter at the cap,
but never longer than REFUSED_MAX, so an unblock is noticed within about 4 s, not 5.

An edge whose server is stopping says so (`move`): the next attempt goes at once to
another edge, one it named if it named any (`move_now`); the backoff resumes only if
that one fails too.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Sequence

import trio

from oz0_node.errors import AgentError

log = logging.getLogger(__name__)

BASE_DELAY = 0.2
MAX_DELAY = 5.0
STABLE_AFTER = 30.0
REFUSED_MIN = 2.0
REFUSED_MAX = 4.0
# 2**5 * 0.2 already exceeds the cap; stop the exponent there.
_MAX_EXPONENT = 16


class Reconnect:
    """One sequence of attempts (joining, or the control stream)."""

    def __init__(
        self,
        edges: Callable[[], Sequence[str]],
        *,
        rng: random.Random | None = None,
        base: float = BASE_DELAY,
        cap: float = MAX_DELAY,
        stable_after: float = STABLE_AFTER,
    ) -> None:
        self._edges = edges
        self._rng = rng or random.Random()
        self._base = base
        self._cap = cap
        self._stable_after = stable_after
        self._retries = 0
        self._started = False
        self._next = 0
        self._up_since: float | None = None
        self._refused = False
        self._now = False

    def delay_bound(self) -> float:
        """The longest the next wait can be."""
        return min(self._cap, self._base * (1 << min(self._retries, _MAX_EXPONENT)))

    def next_delay(self) -> float:
        """The wait before the next attempt (0 for the first one), with jitter."""
        if not self._started or self._now:
            return 0.0
        if self._refused:
            return self._rng.uniform(REFUSED_MIN, REFUSED_MAX)
        return self._rng.uniform(0.0, self.delay_bound())

    async def next_edge(self) -> str:
        """Wait as the policy says, then name the edge to try."""
        delay = self.next_delay()
        self._refused = False
        self._now = False
        if self._started:
            self._retries += 1
        self._started = True
        if delay > 0:
            log.debug("waiting %.2f s before the next attempt", delay)
            await trio.sleep(delay)
        edges = self._edges()
        if not edges:
            raise AgentError("no edge address is known; give --edge HOST:PORT")
        edge = edges[self._next % len(edges)]
        self._next += 1
        return edge

    def same_edge_again(self, *, refused: bool = True) -> None:
        """The last edge answered: ask it again rather than the next; at the pace for
        refusals if it REFUSED us for now, else at the usual one (a renewal ended the
        stream, and the next one is wanted at once)."""
        self._next -= 1
        self._refused = refused

    def elsewhere(self) -> None:
        """The last edge could not be reached or its stream was lost: the next attempt goes
        to one of the other edges at random. Every agent of a server that died then
        spreads over the survivors, instead of all of them moving to the one after it."""
        others = len(self._edges()) - 1
        if others > 1:
            self._next += self._rng.randrange(others)

    def move_now(self, leaving: str, towards: Sequence[str] = ()) -> None:
        """The edge LEAVING asked us to move (its server is stopping): the next attempt
        goes at once, to one of TOWARDS (the edges it named as up) at random, else to one
        of the other known edges at random, so its nodes spread over the rest; to
        LEAVING again only if no other edge is known."""
        self._now = True
        self._refused = False
        edges = list(self._edges())
        others = [i for i, e in enumerate(edges) if e != leaving]
        named = [i for i in others if edges[i] in towards]
        if others:
            self._next = self._rng.choice(named or others)

    def reset(self) -> None:
        """Things work again: the next wait is back to the shortest."""
        self._retries = 0

    def stream_up(self) -> None:
        self._up_since = trio.current_time()

    def stream_down(self) -> None:
        """A stream ended; if it stayed up long enough, the backoff starts over."""
        if self._up_since is not None and trio.current_time() - self._up_since >= (
            self._stable_after
        ):
            self.reset()
        self._up_since = None
