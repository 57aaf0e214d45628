"""Loops that touch the database outlive it: one log line per outage, retries with backoff.

A PostgreSQL restart or failover breaks every pooled connection and the LISTEN connection
at once; each loop meets it on its own schedule. None of them may end the server: they
wait, try again, and say once that they stopped working and once that they work again.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import psycopg
import psycopg.errors
import trio

T = TypeVar("T")

# What a database outage looks like from here: a broken or refused connection, a pool
# that found none in time (PoolTimeout), a server shutting down (AdminShutdown), or one
# read-only after a failover. Not outages: constraint violations and other bugs of ours.
DATABASE_ERRORS: tuple[type[Exception], ...] = (
    psycopg.OperationalError,
    psycopg.InterfaceError,
    psycopg.errors.ReadOnlySqlTransaction,
)

FIRST_RETRY = 0.5
MAX_RETRY = 4.0


@dataclass
class Outage:
    """The state of one loop's outage: when it began, how long to wait before the next try.

    `failed` logs a warning only on the first failure of an outage (the rest at debug);
    `worked` logs how long it lasted once the loop works again.
    """

    what: str
    log: logging.Logger
    first_retry: float = FIRST_RETRY
    max_retry: float = MAX_RETRY
    since: float | None = None
    tries: int = 0
    _rng: random.Random = field(default_factory=random.Random, repr=False)

    @property
    def ongoing(self) -> bool:
        return self.since is not None

    def failed(self, error: BaseException) -> float:
        """Record a failure; return how long to wait before trying again (with jitter, so
        the loops and servers that failed together do not all try again together)."""
        if self.since is None:
            self.since = trio.current_time()
            self.log.warning("%s failed, retrying: %s", self.what, _one_line(error))
        else:
            self.log.debug("%s still failing: %s", self.what, _one_line(error))
        bound = min(self.max_retry, self.first_retry * 2**self.tries)
        self.tries = min(self.tries + 1, 16)
        return self._rng.uniform(bound / 2, bound)

    def worked(self) -> None:
        if self.since is not None:
            self.log.info(
                "%s works again after %.1f s", self.what, trio.current_time() - self.since
            )
        self.since = None
        self.tries = 0


async def until_it_works(outage: Outage, work: Callable[[], Awaitable[T]]) -> T:
    """Await WORK until it raises no database error, waiting as OUTAGE says in between."""
    while True:
        try:
            result = await work()
        except DATABASE_ERRORS as e:
            await trio.sleep(outage.failed(e))
            continue
        outage.worked()
        return result


def _one_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__
