"""The cyclic garbage collector of a long-running server with thousands of streams.

Everything made while the server starts (modules, the Temporal SDK's tables, certificates)
lives as long as the process: it is frozen out of the collector once start-up is over.

Each control stream then holds a few hundred objects for as long as it is open, and the
objects of a stream's read in progress live until its next message, some 5 s. With CPython's
default thresholds (700, 10, 10) a young collection runs every ~12 ms and anything older
than ~0.15 s reaches the oldest generation, so at 4,000 streams it is walked whole (millions
of objects, a pause of a large part of a second) every second or two: most of the Trio
thread's time, and its loop lag (measured: docs/benchmarks-log.md). With a young generation
of 50,000 and twenty young collections per middle one, what lives a few seconds dies before
it is old; the oldest generation is walked after 100 middle collections at the soonest (and
only once it grew by a quarter, CPython's own rule), on a quiet server some tens of minutes
apart.
"""

from __future__ import annotations

import gc
import logging

log = logging.getLogger(__name__)

THRESHOLDS = (50_000, 20, 100)


def tune_after_start_up() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    log.debug(
        "froze %d objects of start-up out of garbage collection; thresholds %s",
        gc.get_freeze_count(),
        THRESHOLDS,
    )
