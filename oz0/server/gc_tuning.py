"""The cyclic garbage collector of a long-running server.

Everything made while the server starts (modules, the Temporal SDK's tables, certificates)
lives as long as the process; left in the collector's generations it is walked again by
every full collection, which with thousands of control streams came to most of the Trio
thread's time. Frozen once start-up is over, full collections walk only what came later.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)


def freeze_start_up() -> None:
    gc.collect()
    gc.freeze()
    log.debug("froze %d objects of start-up out of garbage collection", gc.get_freeze_count())
