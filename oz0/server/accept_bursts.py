"""Accepting connections in bursts: every connection waiting, not one per pass of Trio.

`trio.serve_listeners` accepts one connection and then yields: Trio resumes it after every
other ready task has run once, so a busy server accepted one connection per pass over its
thousands of streams (some 20-50 a second) while a reconnecting fleet filled the listen
queue, and nodes gave up on connections the server accepted only later. Here each listener
accepts, without yielding, what else is waiting (up to BURST) after the one it waited for.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import trio

log = logging.getLogger(__name__)

BURST = 64
# What trio.serve_listeners also sleeps through: out of file descriptors or memory.
CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
CAPACITY_SLEEP = 0.1
# A connection that went away before it was accepted (trio's listener skips these too).
GONE_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM})

Handler = Callable[[trio.SocketStream], Awaitable[object]]


async def serve(
    handler: Handler,
    listeners: list[trio.SocketListener],
    *,
    burst: int = BURST,
    handler_nursery: trio.Nursery | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run HANDLER(stream) for every connection accepted by LISTENERS, until cancelled
    (which closes the listeners); the handlers run in HANDLER_NURSERY if given, so they
    can outlive the accepting, else in this task's own nursery."""
    async with trio.open_nursery() as nursery:
        for listener in listeners:
            nursery.start_soon(
                _accept_forever, listener, handler, handler_nursery or nursery, burst
            )
        task_status.started()


async def _accept_forever(
    listener: trio.SocketListener, handler: Handler, nursery: trio.Nursery, burst: int
) -> None:
    # The same listening socket, as a plain non-blocking socket to take the rest of a
    # burst from without a trip through Trio for each.
    rest = socket.socket(fileno=os.dup(listener.socket.fileno()))
    rest.setblocking(False)
    async with listener:
        with rest:
            while True:
                try:
                    first = await listener.accept()
                except OSError as e:
                    if e.errno not in CAPACITY_ERRNOS:
                        raise
                    log.error(
                        "accept failed: %s; retrying in %g s", os.strerror(e.errno), CAPACITY_SLEEP
                    )
                    await trio.sleep(CAPACITY_SLEEP)
                    continue
                nursery.start_soon(handler, first)
                for _ in range(burst - 1):
                    try:
                        accepted, _ = rest.accept()
                    except (BlockingIOError, InterruptedError):
                        break
                    except OSError as e:
                        if e.errno in CAPACITY_ERRNOS or e.errno in GONE_ERRNOS:
                            break
                        raise
                    stream = trio.SocketStream(trio.socket.from_stdlib_socket(accepted))
                    nursery.start_soon(handler, stream)
