"""Waiting on Trio for the first of several things (the job follower's news or a stop,
the audit stream's commits, keep-alive or a person's change)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio


async def first_of(*waits: Callable[[], Awaitable[None]]) -> None:
    """Until the first of WAITS returns; the others are cancelled."""
    async with trio.open_nursery() as nursery:

        async def one(wait: Callable[[], Awaitable[None]]) -> None:
            await wait()
            nursery.cancel_scope.cancel()

        for wait in waits:
            nursery.start_soon(one, wait)
