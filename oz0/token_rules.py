"""What a join token's ID and labels look like, and what a token gets by default.

Pure rules, apart from `oz0.tokens` so that the command line can check what an operator
typed without loading psycopg and the rest of the server (`oz0.tokens` re-exports them).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from oz0 import label_rules
from oz0.errors import Oz0Error
from oz0.label_rules import LABEL_KEY as LABEL_KEY
from oz0.label_rules import MAX_LABEL_VALUE as MAX_LABEL_VALUE

TOKEN_ID = re.compile(r"^tok-[0-9a-f]{12}$")
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
    label_rules.check_labels(labels)
    return labels
