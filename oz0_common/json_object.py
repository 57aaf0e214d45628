"""A JSON object another process sent (a node, an edge, an attempt's supervisor): what every
message of ours is, read in one place, so that each reader refuses the same things the
same way and only words its refusal."""

from __future__ import annotations

import json
from typing import Any


class NotAnObject(ValueError):
    """Not JSON, or JSON but not an object."""


class TooDeep(NotAnObject):
    """Nested deeper than json's parser goes (about 1,000 levels): a RecursionError there,
    which would end the task reading it rather than refuse the message."""


def parse(raw: str | bytes) -> dict[str, Any]:
    """RAW as a JSON object; NotAnObject (a ValueError) if it is not one."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise TooDeep("nested too deeply") from None
    except ValueError:  # UnicodeDecodeError among them
        raise NotAnObject("not JSON") from None
    if not isinstance(value, dict):
        raise NotAnObject("not a JSON object")
    return value
