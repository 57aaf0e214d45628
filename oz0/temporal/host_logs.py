"""How the Temporal host's log lines become ours.

The Temporal host writes Temporal's own JSON log lines on its stderr; the host keeper hands
each one to `host_line`, which logs it on TEMPORAL_LOGGER at Temporal's level (where those
lines go is the server's logging set-up, oz0.server.logs).
"""

from __future__ import annotations

import json
import logging

TEMPORAL_LOGGER = "oz0.temporal.host"

_host_log = logging.getLogger(TEMPORAL_LOGGER)

# zap's levels (Temporal's logger); a Go panic's lines are not JSON and count as errors.
_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "error": logging.ERROR,
    "dpanic": logging.ERROR,
    "panic": logging.CRITICAL,
    "fatal": logging.CRITICAL,
}


def level_of(line: str) -> int:
    """Temporal's level for one of its log lines, as a logging level."""
    try:
        record = json.loads(line)
    except ValueError:
        return logging.ERROR
    return (
        _LEVELS.get(str(record.get("level")), logging.WARNING)
        if isinstance(record, dict)
        else logging.ERROR
    )


def host_line(line: str) -> None:
    # The JSON line stays whole: it is one line already, and tools parse its fields.
    _host_log.log(level_of(line), "%s", line)
