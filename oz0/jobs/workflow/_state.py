"""What one job's workflow knows as it runs, shared by its signals and its ways to run a
job (once, everywhere, in batches): a value of its own so that each of those is a module
that takes it, not a part of one class."""

from __future__ import annotations

import asyncio

from oz0.jobs.end_reasons import EndReason
from oz0.jobs.workflow._values import PartEnd


class JobState:
    def __init__(self) -> None:
        # The attempts whose node was taken away (`node_removed`), and why; the streamed
        # attempts that ended (`parts_ended`), and how: the first word on each stands.
        self.removed: dict[int, EndReason] = {}
        self.ended: dict[int, PartEnd] = {}
        # The number of the latest attempt placed.
        self.number = 0
        # A cancellation came that an attempt's end, being recorded, held off
        # (`_steps.whole`): no part starts after it.
        self.cancel_heard = False
        # Attempts handed out that no node is known to have yet, and what looks for them
        # (`_attempts.watch_heard`, started with the first of them).
        self.unconfirmed: dict[int, int] = {}  # attempt -> times asked about
        self.watcher: asyncio.Task[None] | None = None
        self.checking = False
