"""What the `orchestrator-zero` and `oz0-node` processes share: how a command ends, and a
root nursery that SIGINT/SIGTERM stop."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

from cyclopts import App, CycloptsError

from oz0_common.errors import Oz0Error, user_error_in

if TYPE_CHECKING:
    import trio

log = logging.getLogger(__name__)


def run_command(app: App, tokens: Sequence[str]) -> int:
    """Run one command; every failure becomes one line on stderr and a non-zero code."""
    try:
        result = app(
            list(tokens), exit_on_error=False, print_error=False, result_action="return_value"
        )
    except CycloptsError as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 2
    except Oz0Error as e:
        print(f"error: {_one_line(str(e))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return result if isinstance(result, int) else 0


def _one_line(message: str) -> str:
    return " ".join(message.split())


async def run_until_signalled(
    start: Callable[[trio.Nursery], Awaitable[None]],
    *,
    drain: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Open the root nursery, let START fill it, and cancel it at SIGINT or SIGTERM.

    With DRAIN, the first signal runs it first (the process winds its work down while
    everything it needs still runs; DRAIN bounds itself) and cancels the root once it
    returns; a second signal cancels at once.

    A user error raised inside (an Oz0Error alone in its exception group) comes out as
    itself, so the command prints one line for it.
    """
    # Here, not at the top: run_command also serves commands that need no event loop
    # (`oz0-node status`, `--help`), which should not pay for importing Trio.
    import trio

    async def drain_then_stop(drain: Callable[[], Awaitable[None]], root: trio.Nursery) -> None:
        await drain()
        root.cancel_scope.cancel()

    try:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with trio.open_nursery() as root:
                await start(root)
                draining = False
                async for signum in signals:
                    name = signal.Signals(signum).name
                    if drain is None or draining:
                        log.info("received %s, stopping", name)
                        root.cancel_scope.cancel()
                        break
                    log.info("received %s, stopping once drained (again: at once)", name)
                    draining = True
                    root.start_soon(drain_then_stop, drain, root)
    except BaseExceptionGroup as group:
        error = user_error_in(group)
        if error is None:
            raise
        raise error from None
