"""Values as the API's JSON writes them, the same in every answer."""

from __future__ import annotations

import datetime as dt


def iso(value: dt.datetime | None) -> str | None:
    """VALUE in ISO 8601 with its offset, or None (null) when there is none."""
    return value.isoformat() if value is not None else None
