"""`orchestrator-zero tenant ...`"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Annotated, Any
from urllib.parse import quote

from cyclopts import App, Parameter, Token

from cli.client import ApiClient
from cli.completers import TenantName
from cli.output import print_fields, print_json, print_table
from cli.params import ContextPath, JsonFlag
from oz0 import cap_rules
from oz0 import retention_rules as rules
from oz0.context import select
from oz0.errors import Oz0Error

app = App(name="tenant", help_format="markdown")  # help: cli/main.py


def _retention(type_: Any, tokens: Sequence[Token]) -> int:
    """cyclopts converter for `--job-retention`: seconds, within the bounds (else one line,
    exit 2, nothing sent)."""
    try:
        return rules.job_retention(tokens[0].value)
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None


def _queued(type_: Any, tokens: Sequence[Token]) -> int:
    try:
        return rules.max_queued(int(tokens[0].value))
    except ValueError:
        raise ValueError(f"invalid number {tokens[0].value!r}: give a whole number") from None
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None


def _schedules(type_: Any, tokens: Sequence[Token]) -> int:
    return _whole(tokens, cap_rules.max_schedules)


def _join_tokens(type_: Any, tokens: Sequence[Token]) -> int:
    return _whole(tokens, cap_rules.max_join_tokens)


def _whole(tokens: Sequence[Token], check: Callable[[int], int]) -> int:
    try:
        return check(int(tokens[0].value))
    except ValueError:
        raise ValueError(f"invalid number {tokens[0].value!r}: give a whole number") from None
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None


def _interval(type_: Any, tokens: Sequence[Token]) -> int:
    try:
        return cap_rules.min_schedule_interval(tokens[0].value)
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None


JobRetention = Annotated[
    int | None, Parameter(converter=_retention, metavar="DURATION", negative=())
]
MaxQueued = Annotated[int | None, Parameter(converter=_queued, metavar="N", negative=())]
MaxSchedules = Annotated[int | None, Parameter(converter=_schedules, metavar="N", negative=())]
MinInterval = Annotated[int | None, Parameter(converter=_interval, metavar="DURATION", negative=())]
MaxJoinTokens = Annotated[int | None, Parameter(converter=_join_tokens, metavar="N", negative=())]


def _file_size(type_: Any, tokens: Sequence[Token]) -> int:
    """cyclopts converter for `--max-file-size`/`--max-files-size`: bytes (64M, 4G)."""
    text = tokens[0].value.strip()
    units = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    number, unit = text.rstrip("KMGTkmgt"), text[len(text.rstrip("KMGTkmgt")) :].upper()
    if not number.isdigit() or unit not in units:
        raise ValueError(f"invalid size {text!r}: give bytes or a size such as 64M or 4G")
    try:
        return cap_rules.max_file_bytes(int(number) * units[unit])
    except rules.RetentionError as e:
        raise ValueError(str(e)) from None


FileSize = Annotated[int | None, Parameter(converter=_file_size, metavar="SIZE", negative=())]


def _body(**settings: int | None) -> dict[str, object]:
    """The API's body: the settings given (their keys are the API's)."""
    return {key: value for key, value in settings.items() if value is not None}


@app.command
def create(
    name: str,
    *,
    job_retention: JobRetention = None,
    max_queued_jobs: MaxQueued = None,
    max_schedules: MaxSchedules = None,
    min_schedule_interval: MinInterval = None,
    max_join_tokens: MaxJoinTokens = None,
    max_file_size: FileSize = None,
    max_files_size: FileSize = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Create tenant NAME and its Temporal namespace.

    Refused when NAME is one of Temporal's own namespaces (it starts with 'temporal-') or
    Temporal already has a namespace NAME that orchestrator-zero did not create.

    Parameters
    ----------
    name
        Lowercase letters, digits and '-', not starting with 'temporal-'.
    job_retention
        How long finished jobs (their attempts and output) are kept after they end, and
        the namespace's workflow histories: 1h to 3650d, such as 12h or 90d (default 30d).
    max_queued_jobs
        How many of its jobs may wait for a node at once; `job run` past it is refused
        (default 10000).
    max_schedules
        How many schedules it may have; `schedule create` past it is refused (default 100).
    min_schedule_interval
        The shortest time between two runs of one of its schedules, such as 30s or 5m;
        a schedule that runs more often is refused (1s to 1d, default 1m).
    max_join_tokens
        How many of its join tokens may let a node in at once (not revoked, expired or
        used up); `token create` past it is refused (default 100).
    max_file_size
        The largest file it may store for pushes, such as 64M (default 64M).
    max_files_size
        All its stored files together, such as 4G (default 4G).
    """
    settings = _body(
        job_retention=job_retention, max_queued_jobs=max_queued_jobs,
        max_schedules=max_schedules, min_schedule_interval=min_schedule_interval,
        max_join_tokens=max_join_tokens, max_file_bytes=max_file_size,
        max_files_bytes=max_files_size,
    )  # fmt: skip
    body = {"name": name, **settings}
    tenant = ApiClient(select(context)).post("/api/v1/tenants", body)
    if json:
        print_json(tenant)
    else:
        print(f"tenant {tenant['name']} created (namespace {tenant['namespace']})")
    return 0


@app.command(name="set")
def set_(
    name: TenantName,
    *,
    job_retention: JobRetention = None,
    max_queued_jobs: MaxQueued = None,
    max_schedules: MaxSchedules = None,
    min_schedule_interval: MinInterval = None,
    max_join_tokens: MaxJoinTokens = None,
    max_file_size: FileSize = None,
    max_files_size: FileSize = None,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Change tenant NAME's job retention (its namespace's too) or its caps.

    A shorter retention deletes what it no longer keeps within seconds.

    Parameters
    ----------
    job_retention
        How long finished jobs are kept after they end: 1h to 3650d, such as 12h or 90d.
    max_queued_jobs
        How many of its jobs may wait for a node at once.
    max_schedules
        How many schedules it may have (those it has stay).
    min_schedule_interval
        The shortest time between two runs of a new schedule of it: 1s to 1d.
    max_join_tokens
        How many of its join tokens may let a node in at once (those it has stay).
    max_file_size
        The largest file it may store for pushes, such as 64M.
    max_files_size
        All its stored files together, such as 4G (those it has stay).
    """
    body = _body(
        job_retention=job_retention, max_queued_jobs=max_queued_jobs,
        max_schedules=max_schedules, min_schedule_interval=min_schedule_interval,
        max_join_tokens=max_join_tokens, max_file_bytes=max_file_size,
        max_files_bytes=max_files_size,
    )  # fmt: skip
    if not body:
        raise Oz0Error(
            "nothing to change: give --job-retention, --max-queued-jobs, --max-schedules,"
            " --min-schedule-interval, --max-join-tokens, --max-file-size or --max-files-size"
        )
    tenant = ApiClient(select(context)).request("PATCH", f"/api/v1/tenants/{quote(name)}", body)
    if json:
        print_json(tenant)
    else:
        print(
            f"tenant {tenant['name']}: keeps finished jobs {tenant['job_retention']},"
            f" at most {tenant['max_queued_jobs']} queued, {tenant['max_schedules']}"
            f" schedules (each at most every {tenant['min_schedule_interval']}),"
            f" {tenant['max_join_tokens']} live join tokens"
        )
    return 0


@app.command
def show(name: TenantName, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Tenant NAME: its namespace, job retention and caps."""
    tenant = ApiClient(select(context)).get(f"/api/v1/tenants/{quote(name)}")
    if json:
        print_json(tenant)
        return 0
    print_fields(
        [
            ("name", tenant["name"]),
            ("namespace", tenant["namespace"]),
            ("created", tenant["created_at"]),
            ("job retention", tenant["job_retention"]),
            ("max queued jobs", tenant["max_queued_jobs"]),
            ("max schedules", tenant["max_schedules"]),
            ("min schedule interval", tenant["min_schedule_interval"]),
            ("max join tokens", tenant["max_join_tokens"]),
            ("max file size", tenant.get("max_file_bytes", "-")),
            ("max files size", tenant.get("max_files_bytes", "-")),
        ]
    )
    return 0


@app.command(name="list")
def list_(*, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Every tenant."""
    tenants = ApiClient(select(context)).get("/api/v1/tenants")["tenants"]
    if json:
        print_json(tenants)
        return 0
    print_table(
        ["NAME", "NAMESPACE", "JOB RETENTION", "MAX QUEUED", "CREATED"],
        [
            [t["name"], t["namespace"], t["job_retention"], t["max_queued_jobs"], t["created_at"]]
            for t in tenants
        ],
    )
    return 0
