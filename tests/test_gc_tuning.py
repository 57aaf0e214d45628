"""The server's garbage collector settings (oz0/server/gc_tuning.py), in a child process so
that this one keeps its own."""

from __future__ import annotations

import json
import subprocess
import sys

from oz0.server import gc_tuning

PROBE = """
import gc, json
from oz0.server import gc_tuning
before = gc.get_threshold()
gc_tuning.tune_after_start_up()
print(json.dumps({"before": before, "after": gc.get_threshold(), "frozen": gc.get_freeze_count()}))
"""


def test_start_up_is_frozen_and_young_objects_get_time_to_die() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, check=True, timeout=60
    )
    found = json.loads(done.stdout)
    assert found["before"] == [700, 10, 10]
    assert found["after"] == list(gc_tuning.THRESHOLDS)
    # Everything imported so far (oz0, trio, ...) is out of the collector.
    assert found["frozen"] > 5_000
