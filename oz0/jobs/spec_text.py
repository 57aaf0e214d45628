"""A job's spec as an operator types it (`job run`'s options, the web UI's run form):
durations and KEY=VALUE pairs. Each parser raises ValueError with one line saying what is
wrong; JobSpec.from_json checks the result like any other request.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from oz0 import node_rules

_NUMBER = r"\d+(?:\.\d+)?"
_SECONDS = re.compile(_NUMBER)
_UNITS = re.compile(
    rf"(?:(?P<d>{_NUMBER})d)?(?:(?P<h>{_NUMBER})h)?(?:(?P<m>{_NUMBER})m)?(?:(?P<s>{_NUMBER})s)?"
)
_UNIT_SECONDS = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# The node sets these for every attempt; a job's own value would be overwritten.
RESERVED_ENV = ("OZ0_JOB_ID", "OZ0_ATTEMPT", "OZ0_NODE_ID")
# What a job does when its attempt's node is lost (`job run --on-lost`), and after how
# long without news from the node it counts as lost when `--lost-after` is not given (the
# workflow's own copy is oz0.jobs.workflow.LOST_AFTER: a test says they agree). `wait`
# waits as Nomad's disconnect block with `replace = false` would: 10 minutes.
ON_LOST = ("move", "wait", "fail")
DEFAULT_ON_LOST = "move"
LOST_AFTER = {"move": 15.0, "wait": 600.0, "fail": 15.0}
MIN_LOST_AFTER = 5.0
MAX_LOST_AFTER = 7 * 24 * 3600.0
# Rolling batches (`job run --all --batch N|P% --batch-wait D --max-failures N|P%`): a
# share is a number of parts or a whole percentage of the matching nodes, kept as text
# ("2", "25%") and counted once the job knows its nodes (oz0.jobs.workflow.share_of).
MAX_BATCH = 100_000
MAX_BATCH_WAIT = 24 * 3600.0
_SHARE = re.compile(r"(\d{1,6})(%?)")


def parse_duration(text: str) -> float:
    """Seconds in TEXT: `90`, `90s`, `1.5s`, `5m`, `1h`, `1h30m`, `2d`; more than 0."""
    cleaned = text.strip()
    if _SECONDS.fullmatch(cleaned):
        seconds = float(cleaned)
    else:
        match = _UNITS.fullmatch(cleaned)
        if not cleaned or match is None:
            raise ValueError(
                f"invalid duration {text!r}: use seconds or a number with d, h, m or s,"
                " such as 90, 90s, 5m, 1h or 1h30m"
            )
        seconds = sum(
            float(part) * _UNIT_SECONDS[unit] for unit, part in match.groupdict().items() if part
        )
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: it must be longer than 0s")
    return seconds


def parse_on_lost(text: str) -> str:
    """`--on-lost`: move, wait or fail."""
    if text not in ON_LOST:
        raise ValueError(f"invalid on-lost {text!r}: use move, wait or fail")
    return text


def parse_lost_after(text: str) -> float:
    """`--lost-after`: a duration from MIN_LOST_AFTER to MAX_LOST_AFTER."""
    seconds = parse_duration(text)
    if not MIN_LOST_AFTER <= seconds <= MAX_LOST_AFTER:
        raise ValueError(f"invalid lost-after {text!r}: give from 5s to 7d")
    return seconds


def parse_share(text: str, what: str, *, least: int) -> str:
    """A `--batch` (LEAST 1) or `--max-failures` (LEAST 0): N parts, from LEAST to
    MAX_BATCH, or P% of the matching nodes, from LEAST% to 100%; as the job keeps it."""
    match = _SHARE.fullmatch(text.strip())
    if match is not None:
        number, percent = int(match[1]), match[2]
        if least <= number <= (100 if percent else MAX_BATCH):
            return f"{number}{percent}"
    raise ValueError(
        f"invalid {what} {text!r}: give a number of nodes from {least} to {MAX_BATCH}"
        f" or a percentage of the matching nodes from {least}% to 100%, such as 2 or 25%"
    )


def parse_batch(text: str) -> str:
    """`--batch`: how many parts run at once, at least 1."""
    return parse_share(text, "batch", least=1)


def parse_max_failures(text: str) -> str:
    """`--max-failures`: how many failed parts a rolling batch goes on after, from 0."""
    return parse_share(text, "max-failures", least=0)


def parse_batch_wait(text: str) -> float:
    """`--batch-wait`: a DURATION from 0 to MAX_BATCH_WAIT (1 day)."""
    seconds = 0.0 if text.strip() in ("0", "0s") else parse_duration(text)
    if seconds > MAX_BATCH_WAIT:
        raise ValueError(f"invalid batch-wait {text!r}: give at most 1d")
    return seconds


def describe_batch(batch: str | None, batch_wait: float, max_failures: str | None) -> str:
    """What `job show` and the job page say of a job's batch: "2 at a time, 5 s between,
    no new part once more than 1 failed"; without one, every node at once."""
    if batch is None:
        return "no (every node at once)"
    text = f"{batch} of the nodes at a time" if batch.endswith("%") else f"{batch} at a time"
    if batch_wait:
        text += f", {_short_duration(batch_wait)} between"
    if max_failures is not None:
        text += f", no new part once more than {max_failures} failed"
    return text


def lost_after_of(on_lost: str, lost_after: float | None) -> float:
    """How long a job's node may go unheard of before it is lost: as asked, else the
    default for its ON_LOST."""
    return lost_after if lost_after is not None else LOST_AFTER.get(on_lost, LOST_AFTER["move"])


def describe_on_lost(on_lost: str, lost_after: float | None) -> str:
    """What `job show` and the job page say after "if its node is lost: ": "move after
    15 s", "wait 10 min, then move", "fail after 15 s"."""
    took = _short_duration(lost_after_of(on_lost, lost_after))
    return f"wait {took}, then move" if on_lost == "wait" else f"{on_lost} after {took}"


def _short_duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g} {unit}"
    return f"{seconds:g} s"


def _split(pair: str, what: str, example: str) -> tuple[str, str]:
    key, equals, value = pair.partition("=")
    if not equals or not key:
        raise ValueError(f"invalid {what} {pair!r}: use KEY=VALUE, such as {example}")
    return key, value


def parse_selector(pairs: Sequence[str]) -> dict[str, str]:
    """Labels a node must have, from KEY=VALUE pairs; keys and values as node labels."""
    selector: dict[str, str] = {}
    for pair in pairs:
        key, value = _split(pair, "selector", "role=web")
        if key in selector:
            raise ValueError(f"selector key {key} is given more than once")
        try:
            node_rules.check_labels({key: value})
        except node_rules.NodeError as e:
            raise ValueError(
                f"invalid selector {pair!r}: {e} (a key is 1 to 63 lowercase letters, digits,"
                " '.', '_', '/' or '-', starting and ending with a letter or digit; a value"
                " at most 253 printable characters)"
            ) from None
        selector[key] = value
    return selector


def parse_env(pairs: Sequence[str]) -> dict[str, str]:
    """Environment variables for the command, from NAME=VALUE pairs."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, value = _split(pair, "env", "LANG=C")
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"invalid env {pair!r}: a name is letters, digits and '_', not starting"
                " with a digit"
            )
        if name in RESERVED_ENV:
            raise ValueError(f"invalid env {pair!r}: the node sets {name} itself")
        if "\0" in value:
            raise ValueError(f"invalid env {pair!r}: a value cannot hold a NUL character")
        if name in env:
            raise ValueError(f"env {name} is given more than once")
        env[name] = value
    return env


def parse_secret_names(names: Sequence[str]) -> list[str]:
    """Names of secret environment variables (`job run --secret-env NAME`), each once."""
    seen: list[str] = []
    for name in names:
        if "=" in name:
            raise ValueError(
                f"invalid secret env {name.partition('=')[0]!r}=...: give only the NAME; its"
                " value is read from this environment, never from the command line"
            )
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(
                f"invalid secret env {name!r}: a name is letters, digits and '_', not starting"
                " with a digit"
            )
        if name in RESERVED_ENV:
            raise ValueError(f"invalid secret env {name!r}: the node sets {name} itself")
        if name in seen:
            raise ValueError(f"secret env {name} is given more than once")
        seen.append(name)
    return seen
