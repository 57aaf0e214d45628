"""What a join token's ID and labels look like, and what a token gets by default.

Pure rules, apart from `oz0.tokens` so that the command line can check what an operator
typed without loading psycopg and the rest of the server (`oz0.tokens` re-exports them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from oz0.errors import Oz0Error

TOKEN_ID = re.compile(r"^tok-[0-9a-f]{12}$")
LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
MAX_LABEL_VALUE = 253
# What a token gets when its creator does not say.
DEFAULT_TTL = "24h"
DEFAULT_MAX_USES = 1


def parse_label_pairs(pairs: Iterable[str]) -> dict[str, str]:
    """Labels from KEY=VALUE pairs, as `token create --label` and the web UI take them."""
    labels: dict[str, str] = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise Oz0Error(f"invalid label {pair!r}: use KEY=VALUE, such as team=data")
        if key in labels:
            raise Oz0Error(f"label {key} is given more than once")
        labels[key] = value
    return labels


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY.fullmatch(key):
            raise Oz0Error(
                f"invalid label key {key!r}: use 1 to 63 lowercase letters, digits, '.', '_', "
                "'/' or '-', starting and ending with a letter or digit"
            )
        if not isinstance(value, str) or len(value) > MAX_LABEL_VALUE or not value.isprintable():
            raise Oz0Error(
                f"invalid value for label {key}: use at most {MAX_LABEL_VALUE} printable characters"
            )
    return labels
