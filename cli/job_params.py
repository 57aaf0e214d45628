"""What `job run` reads from its command line: durations, KEY=VALUE pairs, sizes and CPU
fractions (limits), a job ID.

Each converter raises ValueError, which cyclopts turns into one line naming the option
(exit code 2, as for any other bad parameter).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Annotated, Any

from cyclopts import CycloptsError, Parameter, Token

from oz0.jobs.limits import parse_cpu, parse_size
from oz0.jobs.spec_text import (
    parse_batch,
    parse_batch_wait,
    parse_duration,
    parse_env,
    parse_lost_after,
    parse_max_failures,
    parse_on_lost,
    parse_secret_names,
    parse_selector,
)

__all__ = [
    "parse_cpu", "parse_duration", "parse_env", "parse_lost_after", "parse_on_lost",
    "parse_secret_names", "parse_selector", "parse_size",
]  # fmt: skip

_JOB_ID = re.compile(r"job-[0-9a-f]{12}")


def duration(type_: Any, tokens: Sequence[Token]) -> float:
    """cyclopts converter for a DURATION option."""
    return parse_duration(tokens[0].value)


def batch_share(type_: Any, tokens: Sequence[Token]) -> str:
    """cyclopts converter for `--batch`: N nodes (from 1) or P% of the matching nodes."""
    return parse_batch(tokens[0].value)


def max_failures_share(type_: Any, tokens: Sequence[Token]) -> str:
    """cyclopts converter for `--max-failures`: N parts (from 0) or P% of them."""
    return parse_max_failures(tokens[0].value)


def batch_wait_duration(type_: Any, tokens: Sequence[Token]) -> float:
    """cyclopts converter for `--batch-wait`: a DURATION from 0 to 1d."""
    return parse_batch_wait(tokens[0].value)


def lost_after_duration(type_: Any, tokens: Sequence[Token]) -> float:
    """cyclopts converter for `--lost-after`: a DURATION from 5s to 7d."""
    return parse_lost_after(tokens[0].value)


def on_lost_choice(type_: Any, tokens: Sequence[Token]) -> str:
    """cyclopts converter for `--on-lost`: move, wait or fail."""
    return parse_on_lost(tokens[0].value)


def size_bytes(type_: Any, tokens: Sequence[Token]) -> int:
    """cyclopts converter for a SIZE option (`--memory 512M`): bytes."""
    return parse_size(tokens[0].value)


def cpus(type_: Any, tokens: Sequence[Token]) -> float:
    """cyclopts converter for `--cpu 0.5`: a number of CPUs."""
    return parse_cpu(tokens[0].value)


def selector_pairs(type_: Any, tokens: Sequence[Token]) -> list[str]:
    """cyclopts converter for `--selector`: every pair checked, kept as given."""
    values = [t.value for t in tokens]
    parse_selector(values)
    return values


def env_pairs(type_: Any, tokens: Sequence[Token]) -> list[str]:
    """cyclopts converter for `--env`: every pair checked, kept as given."""
    values = [t.value for t in tokens]
    parse_env(values)
    return values


def secret_names(type_: Any, tokens: Sequence[Token]) -> list[str]:
    """cyclopts converter for `--secret-env`: names only (the values are read from the
    environment, never from the command line)."""
    values = [t.value for t in tokens]
    parse_secret_names(values)
    return values


def secret_values(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Each NAME's value from ENVIRON (the CLI's own environment); a usage error naming
    the first that is not set."""
    missing = [name for name in names if name not in environ]
    if missing:
        raise usage_error(
            f"--secret-env {missing[0]}: {missing[0]} is not set in this environment;"
            f" export it first (the value is read from there, never from the command line)"
        )
    return {name: environ[name] for name in names}


def check_job_id(job_id: str) -> str:
    if not _JOB_ID.fullmatch(job_id):
        raise usage_error(f"invalid job ID {job_id!r}: job IDs look like job-0123456789ab")
    return job_id


def usage_error(message: str) -> CycloptsError:
    """A bad-parameter error found in a command's body: reported like cyclopts' own (exit 2)."""
    return CycloptsError(msg=message)


# The options that choose nodes and pace a rollout, as every command that makes a job
# takes them (`job run`, `file push`, `file pull`).
Selectors = Annotated[
    list[str] | None, Parameter(negative=(), converter=selector_pairs, metavar="KEY=VALUE")
]
BatchShare = Annotated[str | None, Parameter(converter=batch_share, metavar="N|P%")]
