"""`orchestrator-zero schedule ...`: jobs run on a cron or an interval by Temporal Schedules.

`schedule create` takes its own options (when and how it runs) and every option of `job
run` (what it runs), which `job run`'s own signature parses (cli/job_cmds.job_body): the
two commands cannot drift apart.
"""

from __future__ import annotations

import datetime as dt
import re
import shlex
from collections.abc import Sequence
from typing import Annotated, Any

from cyclopts import App, Parameter

from cli import job_cmds
from cli.client import ApiClient
from cli.completers import ScheduleId, TenantOption
from cli.job_params import duration, usage_error
from cli.output import print_fields, print_json, print_table, terminal_safe
from cli.params import ContextPath, Flag, JsonFlag
from oz0.context import select

app = App(name="schedule", help_format="markdown")  # help: cli/main.py

OVERLAPS = ("skip", "buffer-one", "allow", "cancel-other")
_SCHEDULE_ID = re.compile(r"sched-[0-9a-f]{12}")
_HELP_FLAGS = ("--help", "-h")
# `schedule create`'s own options and how many values each takes; every other option
# before `--` is `job run`'s.
_OWN_OPTIONS = {
    "--cron": 1,
    "--every": 1,
    "--timezone": 1,
    "--overlap": 1,
    "--catchup-window": 1,
    "--pause-on-failure": 0,
    "--json": 0,
    "--context": 1,
}


@app.meta.default
def _schedule(*tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)]) -> Any:
    """Schedules: jobs run on a cron or an interval."""
    if tokens[:1] == ("create",) and not set(tokens) & set(_HELP_FLAGS):
        return _create_from(tokens[1:])
    return app(list(tokens), exit_on_error=False, print_error=False, result_action="return_value")


# What cli.main registers as `schedule`: every `schedule` command line goes through it.
meta = app.meta


@app.command
def create(
    *,
    cron: str | None = None,
    every: Annotated[float | None, Parameter(converter=duration, metavar="DURATION")] = None,
    timezone: str | None = None,
    overlap: Annotated[str, Parameter(metavar="|".join(OVERLAPS))] = "skip",
    catchup_window: Annotated[
        float, Parameter(converter=duration, metavar="DURATION", show_default=False)
    ] = 60.0,
    pause_on_failure: Flag = False,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Run a job on a schedule: `schedule create --cron EXPR [options] [job run options] -- CMD`.

    Every option of `job run` (--tenant, --selector, --node, --all, --timeout, --retries,
    --env, --memory, ...: see `job run --help`) says what each run runs; each run is an
    ordinary job (`job list --schedule ID`), created by you and started by the schedule.
    Secrets (--secret-env) cannot be scheduled.

    Parameters
    ----------
    cron
        When it runs: a cron expression of 5 fields (minute hour day-of-month month
        day-of-week), such as '*/15 * * * *', or @hourly, @daily, @weekly.
    every
        Or: how often it runs, such as 30s, 5m or 1h (from 1s).
    timezone
        The time zone of --cron, such as Europe/Paris. [default: UTC]
    overlap
        When a run is due while the last one still runs: skip it (the default), start it
        once that one ends (buffer-one), start it anyway (allow), or cancel the running
        one (cancel-other).
    catchup_window
        A run missed while the cluster was down is still started within this long after
        its time (from 10s). [default: 1m]
    pause_on_failure
        Pause the schedule when a run's job does not succeed.
    """
    raise usage_error(
        "schedule create needs the command after --, such as:"
        " orchestrator-zero schedule create --cron '0 3 * * *' -- uptime"
    )


def _create_from(tokens: Sequence[str]) -> int:
    """`schedule create TOKENS`: its own options by `create`'s signature, the rest by `job
    run`'s, then one request."""
    if "--" not in tokens:
        create()  # says what is missing
    cut = list(tokens).index("--")
    own, theirs = _split(tokens[:cut])
    _, bound, _ = app.parse_args(["create", *own], exit_on_error=False, print_error=False)
    mine = {**bound.kwargs}
    # What only a followed `job run` has (how it shows the job), or what a schedule cannot keep.
    for forbidden in (
        "--detach",
        "--secret-env",
        "--file",
        "--output",
        "--progress",
        "--no-progress",
    ):
        if forbidden in theirs or any(t.startswith(forbidden + "=") for t in theirs):
            raise usage_error(f"{forbidden} does not go with a schedule")
    _, job_bound, _ = job_cmds.app.parse_args(
        ["run", *theirs, "--", *tokens[cut + 1 :]], exit_on_error=False, print_error=False
    )
    job_bound.apply_defaults()
    options = {k: v for k, v in job_bound.arguments.items() if k not in ("command",)}
    job = job_cmds.job_body(tuple(job_bound.arguments.get("command", ())), options)
    return _create(job, **mine)


def _split(tokens: Sequence[str]) -> tuple[list[str], list[str]]:
    """TOKENS (before `--`) as `schedule create`'s own options and `job run`'s."""
    own: list[str] = []
    theirs: list[str] = []
    i = 0
    while i < len(tokens):
        token = tokens[i]
        name = token.partition("=")[0]
        if name in _OWN_OPTIONS:
            takes = 0 if "=" in token else _OWN_OPTIONS[name]
            own.extend(tokens[i : i + 1 + takes])
            i += 1 + takes
        else:
            theirs.append(token)
            i += 1
    return own, theirs


def _create(
    job: dict[str, Any],
    *,
    cron: str | None = None,
    every: float | None = None,
    timezone: str | None = None,
    overlap: str = "skip",
    catchup_window: float = 60.0,
    pause_on_failure: bool = False,
    json: bool = False,
    context: Any = None,
) -> int:
    if (cron is None) == (every is None):
        raise usage_error("give --cron EXPR or --every DURATION (how often it runs)")
    if overlap not in OVERLAPS:
        raise usage_error(f"invalid --overlap {overlap!r}: use {', '.join(OVERLAPS)}")
    if every is not None and timezone is not None:
        raise usage_error("--timezone goes with --cron: an interval runs the same in any zone")
    body: dict[str, Any] = {
        "job": job,
        "overlap": overlap,
        "catchup_window": catchup_window,
        "pause_on_failure": pause_on_failure,
    }
    if cron is not None:
        body["cron"] = cron
    if every is not None:
        body["every"] = every
    if timezone is not None:
        body["timezone"] = timezone
    made = ApiClient(select(context)).post("/api/v1/schedules", body)
    if json:
        print_json(made)
    else:
        print(terminal_safe(made["id"]))
    return 0


@app.command(name="list")
def list_(
    *, tenant: TenantOption = None, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """The schedules, newest first, with whether each is paused and its next time.

    Parameters
    ----------
    tenant
        Only schedules of this tenant.
    """
    found = ApiClient(select(context)).get("/api/v1/schedules", {"tenant": tenant})["schedules"]
    if json:
        print_json(found)
        return 0
    print_table(
        ["ID", "TENANT", "WHEN", "OVERLAP", "STATE", "NEXT", "COMMAND"],
        [
            [s["id"], s["tenant"], s["when"], s["overlap"], _state(s),
             _time(s["next_times"][0] if s["next_times"] else None),
             _short(shlex.join(s["command"]))]
            for s in found
        ],
    )  # fmt: skip
    return 0


@app.command
def show(schedule_id: ScheduleId, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """One schedule: what it runs, its state, its next five times and its last runs."""
    shown = ApiClient(select(context)).get(f"/api/v1/schedules/{_check_id(schedule_id)}")
    if json:
        print_json(shown)
        return 0
    temporal = shown["temporal"] or {}
    job = shown["job"]
    print_fields(
        [
            ("id", shown["id"]),
            ("tenant", shown["tenant"]),
            ("when", shown["when"]),
            ("overlap", shown["overlap"]),
            ("catch-up window", f"{shown['catchup_window']:g}s"),
            ("pause on failure", "yes" if shown["pause_on_failure"] else "no"),
            ("state", _state(shown)),
            ("note", temporal.get("note") or "-"),
            ("runs started", temporal.get("actions", "-")),
            ("skipped (overlap)", temporal.get("skipped_overlap", "-")),
            ("missed (catch-up window)", temporal.get("missed_catchup", "-")),
            ("command", shlex.join(job["command"])),
            ("selector", ",".join(f"{k}={v}" for k, v in sorted(job.get("selector", {}).items()))
             or "-"),
            ("node", job.get("node") or ("all matching" if job.get("all") else "-")),
            ("created", f"{_time(shown['created_at'])} by {shown['created_by']}"),
            ("owner (runs as)", shown.get("owner") or shown["created_by"]),
        ]
    )  # fmt: skip
    print()
    print("next times:" if shown["next_times"] else "next times: none (paused or ended)")
    for at in shown["next_times"]:
        print(f"  {_time(at)}")
    print()
    runs = shown["runs"]
    if not runs:
        print("no runs yet")
        return 0
    print_table(
        ["JOB", "STATE", "EXIT", "CREATED", "ENDED", "REASON"],
        [
            [r["id"], r["state"], "-" if r["exit_code"] is None else r["exit_code"],
             _time(r["created_at"]), _time(r["ended_at"]), r["reason"] or "-"]
            for r in runs
        ],
    )  # fmt: skip
    return 0


@app.command
def pause(
    schedule_id: ScheduleId, /, *, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """Pause a schedule: no run starts until it is unpaused (a run under way goes on)."""
    return _act(schedule_id, "pause", json, context)


@app.command
def unpause(
    schedule_id: ScheduleId, /, *, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """Unpause a schedule: it runs at its next time again."""
    return _act(schedule_id, "unpause", json, context)


@app.command
def trigger(
    schedule_id: ScheduleId, /, *, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """Run a schedule's job now, under its overlap policy (a `skip` schedule whose last run
    still runs starts none)."""
    return _act(schedule_id, "trigger", json, context)


@app.command(name="set")
def set_(
    schedule_id: ScheduleId,
    /,
    *,
    owner: Annotated[str, Parameter(metavar="NAME")],
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """Give a schedule to another person (an admin's): its runs start jobs in that person's
    name from now on. One paused because its owner left or lost the right is resumed.

    Parameters
    ----------
    owner
        The new owner: an operator or admin of the schedule's tenant.
    """
    client = ApiClient(select(context))
    done = client.request("PATCH", f"/api/v1/schedules/{_check_id(schedule_id)}", {"owner": owner})
    if json:
        print_json(done)
        return 0
    resumed = "; resumed" if done["resumed"] else ""
    print(
        terminal_safe(
            f"schedule {done['id']}: owner {done['owner']} (was {done['previous_owner']}){resumed}"
        )
    )
    return 0


@app.command
def delete(
    schedule_id: ScheduleId, /, *, json: JsonFlag = False, context: ContextPath = None
) -> int:
    """Delete a schedule: no run starts any more; its jobs stay (`job list --schedule ID`)."""
    return _act(schedule_id, "delete", json, context)


def _act(schedule_id: str, action: str, json: bool, context: Any) -> int:
    client = ApiClient(select(context))
    path = f"/api/v1/schedules/{_check_id(schedule_id)}"
    if action == "delete":
        done = client.request("DELETE", path)
    else:
        done = client.post(f"{path}/{action}", {})
    if json:
        print_json(done)
    else:
        print(terminal_safe(f"schedule {done['id']}: {_DONE[action]}"))
    return 0


_DONE = {
    "pause": "paused",
    "unpause": "unpaused",
    "trigger": "triggered (a run starts now unless its overlap policy skips it)",
    "delete": "deleted",
}


def _check_id(schedule_id: str) -> str:
    if not _SCHEDULE_ID.fullmatch(schedule_id):
        raise usage_error(
            f"invalid schedule ID {schedule_id!r}: schedule IDs look like sched-0123456789ab"
        )
    return schedule_id


def _state(schedule: dict[str, Any]) -> str:
    if schedule.get("paused_reason"):
        return f"paused: {schedule['paused_reason']}"
    temporal = schedule.get("temporal")
    if temporal is None:
        return "unknown (Temporal unreachable)"
    if not temporal.get("found"):
        return "missing in Temporal"
    return "paused" if temporal.get("paused") else "active"


def _short(text: str, width: int = 40) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _time(iso: str | None) -> str:
    if iso is None:
        return "-"
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
