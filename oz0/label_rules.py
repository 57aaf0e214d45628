"""A label's rules, for nodes, tokens and selectors alike: what a key and a value may be,
and the one line that says what is wrong."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from oz0.errors import Oz0Error

LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
MAX_LABEL_VALUE = 253


def label_problem(key: object, value: object) -> str | None:
    """What is wrong with the label KEY: VALUE, in one line (None: nothing)."""
    if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
        return (
            f"invalid label key {key!r}: use 1 to 63 lowercase letters, digits, '.', '_', "
            "'/' or '-', starting and ending with a letter or digit"
        )
    if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE or not value.isprintable():
        return f"invalid value for label {key}: use at most {MAX_LABEL_VALUE} printable characters"
    return None


def check_labels(labels: Mapping[Any, object], error: type[Oz0Error] = Oz0Error) -> None:
    """ERROR, saying what is wrong with the first label of LABELS that breaks the rules."""
    for key, value in labels.items():
        problem = label_problem(key, value)
        if problem is not None:
            raise error(problem)
