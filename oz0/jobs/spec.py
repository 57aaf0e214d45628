"""What an operator asks for with `job run`, checked before anything is written."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any, Literal, Required, TypedDict

from oz0 import nodes
from oz0.errors import Oz0Error
from oz0.jobs import limits as job_limits
from oz0.jobs.spec_text import (
    DEFAULT_ON_LOST,
    MAX_BATCH_WAIT,
    MAX_LOST_AFTER,
    MIN_LOST_AFTER,
    ON_LOST,
    parse_share,
)
from oz0_common import attempt_messages, file_push

STATES = ("queued", "running", "succeeded", "failed", "cancelled", "lost")
ENDED_STATES = ("succeeded", "failed", "cancelled", "lost")
MAX_ARGS = 1024
MAX_COMMAND_BYTES = 64 * 1024
MAX_ENV = 64
MAX_ENV_VALUE = 32 * 1024
MAX_NAME = 200
MAX_RETRIES = 100
MAX_TIMEOUT = 30 * 24 * 3600.0
DEFAULT_QUEUE_TIMEOUT = 600.0
MAX_QUEUE_TIMEOUT = 7 * 24 * 3600.0
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# The agent sets these itself, for each attempt.
RESERVED_ENV_PREFIX = "OZ0_"


class JobError(Oz0Error):
    """A job that cannot be made or changed as asked: the message says why."""


class JobNotFound(JobError):
    pass


class JobEnded(JobError):
    """The job has ended: it cannot be changed any more."""


class TooManyQueued(JobError):
    """The tenant has as many jobs queued as its cap allows (`tenant set --max-queued-jobs`):
    nothing was created. The API answers 429."""


def new_job_id() -> str:
    return "job-" + secrets.token_hex(6)


def is_job_id(text: str) -> bool:
    return attempt_messages.is_job_id(text)


@dataclass(frozen=True)
class JobSpec:
    tenant: str
    command: list[str]
    selector: dict[str, str] = field(default_factory=dict)
    node: str | None = None
    all_nodes: bool = False
    timeout: float | None = None
    retries: int = 0
    env: dict[str, str] = field(default_factory=dict)
    name: str | None = None
    no_move: bool = False
    queue_timeout: float = DEFAULT_QUEUE_TIMEOUT
    # Resource limits for each attempt (limits.py): sizes in bytes, only those asked.
    limits: dict[str, int | float] = field(default_factory=dict)
    # What its attempt does when its node is lost, and after how long unheard of (None:
    # the default for ON_LOST, spec_text.LOST_AFTER).
    on_lost: str = DEFAULT_ON_LOST
    lost_after: float | None = None
    # A rolling batch (all_nodes only): at most BATCH parts at once ("N" or "P%" of the
    # matching nodes), each slot idle BATCH_WAIT seconds after its part ends, no new part
    # once more than MAX_FAILURES ("N" or "P%") have failed. None: every part at once.
    batch: str | None = None
    batch_wait: float = 0.0
    max_failures: str | None = None
    # Secret values: sealed as the job is made, never kept with it, shown or logged (not
    # even in this spec's repr).
    secret_env: dict[str, str] = field(default_factory=dict, repr=False)
    # Files placed in each attempt's working directory before its command starts (`job run
    # --file`): [{"sha256", "size", "name"}], each a complete file of the tenant's.
    files: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> JobSpec:
        unknown = set(body) - _FIELDS
        if unknown:
            raise JobError(f"unknown field {sorted(unknown)[0]!r} in the job")
        tenant = body.get("tenant", nodes.DEFAULT_TENANT)
        if not isinstance(tenant, str) or not tenant:
            raise JobError("tenant must be a tenant's name")
        node = body.get("node")
        if node is not None:
            if not isinstance(node, str):
                raise JobError("node must be a node ID")
            try:
                nodes.check_node_id(node)
            except nodes.NodeError as e:
                raise JobError(str(e)) from None
        all_nodes = _flag(body, "all")
        if all_nodes and node is not None:
            raise JobError("give either a node or all, not both")
        try:
            selector = nodes.check_labels(body.get("selector", {}))
        except nodes.NodeError as e:
            raise JobError(f"selector: {e}") from None
        env = _env(body.get("env", {}))
        batch, batch_wait, max_failures = _batch(body, all_nodes)
        return cls(
            tenant=tenant,
            command=_command(body.get("command")),
            selector=selector,
            node=node,
            all_nodes=all_nodes,
            timeout=_seconds(body.get("timeout"), "timeout", MAX_TIMEOUT, optional=True),
            retries=_retries(body.get("retries", 0)),
            env=env,
            name=_name(body.get("name")),
            no_move=_flag(body, "no_move"),
            queue_timeout=_seconds(
                body.get("queue_timeout", DEFAULT_QUEUE_TIMEOUT), "queue_timeout",
                MAX_QUEUE_TIMEOUT, optional=False,
            ) or DEFAULT_QUEUE_TIMEOUT,
            limits=_limits(body.get("limits", {})),
            on_lost=_on_lost(body.get("on_lost", DEFAULT_ON_LOST)),
            lost_after=_lost_after(body.get("lost_after")),
            batch=batch,
            batch_wait=batch_wait,
            max_failures=max_failures,
            secret_env=_secret_env(body.get("secret_env", {}), env),
            files=_files(body.get("files", [])),
        )  # fmt: skip


class FileRef(TypedDict):
    """A complete file of the tenant's, placed in each attempt's working directory."""

    sha256: str
    size: int
    name: str


class JobBody(TypedDict, total=False):
    """`POST /api/v1/jobs`'s body (checked by JobSpec.from_json, which takes these fields
    and no other): the command and where and how it runs."""

    tenant: str
    command: Required[list[str]]
    selector: dict[str, str]
    node: str
    all: bool
    timeout: float | None
    retries: int
    env: dict[str, str]
    name: str | None
    no_move: bool
    queue_timeout: float
    # Resource limits for each attempt (limits.py).
    limits: dict[str, int | float] | None
    secret_env: dict[str, str]
    on_lost: Literal["move", "wait", "fail"]
    lost_after: float | None
    # "N" nodes or "P%" of them at once.
    batch: int | str | None
    batch_wait: float
    max_failures: int | str | None
    files: list[FileRef]


_FIELDS = JobBody.__required_keys__ | JobBody.__optional_keys__
MAX_FILES = 32


def _files(value: object) -> list[dict[str, Any]]:
    """`files`: each {"sha256", "size", "name"}, NAME a plain file name, none twice."""
    if not isinstance(value, list) or len(value) > MAX_FILES:
        raise JobError(f"files must be a list of at most {MAX_FILES}")
    files: list[dict[str, Any]] = []
    for entry in value:
        if not isinstance(entry, dict) or set(entry) != {"sha256", "size", "name"}:
            raise JobError("each of files is {sha256, size, name}")
        try:
            file_push.check_name(entry["name"])
            file_push.PushOrder(entry["sha256"], entry["size"], entry["name"])
        except file_push.BadPush as e:
            raise JobError(f"files: {e}") from None
        files.append({"sha256": entry["sha256"], "size": entry["size"], "name": entry["name"]})
    if len({f["name"] for f in files}) != len(files):
        raise JobError("files: two files of one name")
    return files


def _batch(body: dict[str, Any], all_nodes: bool) -> tuple[str | None, float, str | None]:
    """The rolling batch asked (batch, batch_wait, max_failures): each checked, and the
    two others only with a batch, which goes only with all."""
    batch = _share(body.get("batch"), "batch", least=1)
    wait = body.get("batch_wait", 0)
    if (
        isinstance(wait, bool)
        or not isinstance(wait, int | float)
        or not (0 <= wait <= MAX_BATCH_WAIT)
    ):
        raise JobError(f"batch_wait must be a number of seconds from 0 to {MAX_BATCH_WAIT:g}")
    max_failures = _share(body.get("max_failures"), "max_failures", least=0)
    if batch is not None and not all_nodes:
        raise JobError("batch goes with all: a rolling batch runs on every matching node")
    if batch is None and wait:
        raise JobError("batch_wait goes with batch: it is the pause between a batch's parts")
    if batch is None and max_failures is not None:
        raise JobError(
            "max_failures goes with batch: without one every part starts at once, so no"
            " failure can stop the others from starting"
        )
    return batch, float(wait), max_failures


def _share(value: object, key: str, *, least: int) -> str | None:
    """A batch's share: N (a whole number, or its text) or "P%"; None if not given."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise JobError(f'{key} must be a number of nodes or a percentage such as "25%"')
    try:
        return parse_share(str(value), key, least=least)
    except ValueError as e:
        raise JobError(str(e)) from None


def _on_lost(value: object) -> str:
    if not isinstance(value, str) or value not in ON_LOST:
        raise JobError("on_lost must be move, wait or fail")
    return value


def _lost_after(value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobError("lost_after must be a number of seconds")
    if not MIN_LOST_AFTER <= value <= MAX_LOST_AFTER:
        raise JobError(
            f"lost_after must be from {MIN_LOST_AFTER:g} to {MAX_LOST_AFTER:g} seconds (7 days)"
        )
    return float(value)


def _flag(body: dict[str, Any], key: str) -> bool:
    value = body.get(key, False)
    if not isinstance(value, bool):
        raise JobError(f"{key} must be true or false")
    return value


def _command(value: object) -> list[str]:
    if not isinstance(value, list) or not value:
        raise JobError("command must be a non-empty list of arguments (the program first)")
    if len(value) > MAX_ARGS:
        raise JobError(f"command has more than {MAX_ARGS} arguments")
    if not all(isinstance(a, str) for a in value):
        raise JobError("every argument of the command must be text")
    if not value[0]:
        raise JobError("the command's program is empty")
    if any("\0" in a for a in value):
        raise JobError("the command holds a NUL character, which no program can receive")
    if sum(len(a.encode()) for a in value) > MAX_COMMAND_BYTES:
        raise JobError(f"the command is longer than {MAX_COMMAND_BYTES // 1024} KiB")
    return list(value)


def _seconds(value: object, key: str, limit: float, *, optional: bool) -> float | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise JobError(f"{key} must be a number of seconds")
    if not 0 < value <= limit:
        raise JobError(f"{key} must be more than 0 and at most {limit:g} seconds")
    return float(value)


def _retries(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_RETRIES:
        raise JobError(f"retries must be a whole number from 0 to {MAX_RETRIES}")
    return value


def _env(value: object, what: str = "env") -> dict[str, str]:
    # The messages name variables, never values: a secret_env's are secret.
    if not isinstance(value, dict) or len(value) > MAX_ENV:
        raise JobError(f"{what} must be an object of at most {MAX_ENV} NAME: VALUE pairs")
    for key, text in value.items():
        if not isinstance(key, str) or not _ENV_NAME.fullmatch(key):
            raise JobError(f"invalid environment variable name {key!r}")
        if key.startswith(RESERVED_ENV_PREFIX):
            raise JobError(f"{key}: names starting with {RESERVED_ENV_PREFIX} are the agent's")
        if not isinstance(text, str) or "\0" in text or len(text) > MAX_ENV_VALUE:
            raise JobError(f"invalid value for environment variable {key}")
    return dict(value)


def _limits(value: object) -> dict[str, int | float]:
    if value is None:
        return {}
    try:
        return job_limits.check(value)
    except ValueError as e:
        raise JobError(str(e)) from None


def _secret_env(value: object, env: dict[str, str]) -> dict[str, str]:
    secret = _env(value, "secret_env")
    both = sorted(set(secret) & set(env))
    if both:
        raise JobError(f"{both[0]} is given both in env and in secret_env: give it once")
    if len(secret) + len(env) > MAX_ENV:
        raise JobError(f"env and secret_env hold more than {MAX_ENV} variables together")
    return secret


def _name(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) > MAX_NAME or not value.isprintable():
        raise JobError(f"name must be printable text of at most {MAX_NAME} characters")
    return value or None
