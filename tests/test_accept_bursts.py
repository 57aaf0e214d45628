"""Accepting what waits in the listen queue at once (oz0/server/accept_bursts.py).

A listener on 127.0.0.1 with an ephemeral port; connections queued before it accepts.
The count of Trio passes a busy task sees between the first and the last accept tells
whether they were taken in one burst or one per pass (what trio.serve_listeners does).
"""

from __future__ import annotations

import socket
from functools import partial
from typing import Any

import trio

from oz0.server import accept_bursts


async def busy(passes: list[int]) -> None:
    while True:
        passes[0] += 1
        await trio.lowlevel.checkpoint()


async def accepted_at_passes(serve: Any, queued: int) -> list[int]:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listeners[0].socket.getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(queued)]
    passes = [0]
    seen: list[int] = []
    all_seen = trio.Event()

    async def handler(stream: trio.SocketStream) -> None:
        seen.append(passes[0])
        if len(seen) == queued:
            all_seen.set()
        await stream.aclose()

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(busy, passes)
            await nursery.start(partial(serve, handler, listeners))
            with trio.fail_after(10):
                await all_seen.wait()
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            client.close()
    return seen


async def test_the_whole_queue_is_accepted_in_one_pass() -> None:
    seen = await accepted_at_passes(accept_bursts.serve, 20)
    assert len(seen) == 20
    assert max(seen) - min(seen) <= 2, seen


async def test_trio_serve_listeners_takes_one_per_pass_which_is_why() -> None:
    seen = await accepted_at_passes(trio.serve_listeners, 20)
    assert max(seen) - min(seen) >= 10, seen


async def test_bursts_are_bounded_and_the_rest_come_next() -> None:
    # Eight bursts of 5, one a pass: seven passes apart, give or take the pass or two that
    # Trio's shuffled run order moves a task by (one burst of all is 2 at most, above).
    seen = await accepted_at_passes(partial(accept_bursts.serve, burst=5), 40)
    assert len(seen) == 40
    assert max(seen) - min(seen) >= 5, seen
