"""`orchestrator-zero job ...`: run a command on the fleet, follow it, list, show, cancel."""

from __future__ import annotations

import datetime as dt
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

from cyclopts import App, Parameter

from cli.client import TIMEOUT, ApiClient, ApiError
from cli.completers import JobId, NodeOption, ScheduleOption, TenantName, TenantOption
from cli.file_results import push_results
from cli.file_upload import placed_files
from cli.job_follow import ENDED_STATES, Follower, Sink, outcome
from cli.job_lines import OutputMode
from cli.job_params import (
    BatchShare,
    Selectors,
    batch_wait_duration,
    check_job_id,
    cpus,
    duration,
    env_pairs,
    lost_after_duration,
    max_failures_share,
    on_lost_choice,
    parse_env,
    parse_selector,
    secret_names,
    secret_values,
    size_bytes,
    usage_error,
)
from cli.job_recap import recap_json, recap_lines
from cli.job_view import Shown, View
from cli.output import print_fields, print_json, print_table, terminal_safe, warn
from cli.params import ContextPath, Flag, JsonFlag
from oz0 import node_rules
from oz0.context import select
from oz0.jobs import limits as job_limits
from oz0.jobs.spec_text import DEFAULT_ON_LOST, describe_batch, describe_on_lost
from oz0_common.file_push import PUSH

app = App(name="job", help_format="markdown")  # help: cli/main.py

DEFAULT_QUEUE_TIMEOUT = 600.0
COMMAND_WIDTH = 48
_HELP_FLAGS = ("--help", "-h")


# Every `job` command line passes the meta app first, to check that `job run` has its `--`:
# cyclopts takes options before or after the positional arguments, so without it a
# `job run rm --all` would run `rm` on every node. With `--` required, what follows it is
# the command and nothing else.
@app.meta.default
def _job(*tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)]) -> Any:
    """Jobs: commands run on the fleet's nodes."""
    if tokens[:1] == ("run",) and "--" not in tokens and not set(tokens) & set(_HELP_FLAGS):
        raise usage_error(
            "job run needs the command after --, such as:"
            " orchestrator-zero job run --selector role=web -- uptime"
        )
    return app(list(tokens), exit_on_error=False, print_error=False, result_action="return_value")


# What cli.main registers as `job`: every `job` command line goes through the meta app.
meta = app.meta


@app.command
def run(
    *command: str,
    tenant: TenantName = node_rules.DEFAULT_TENANT,
    selector: Selectors = None,
    node: NodeOption = None,
    all: Flag = False,
    batch: BatchShare = None,
    batch_wait: Annotated[
        float | None, Parameter(converter=batch_wait_duration, metavar="DURATION")
    ] = None,
    max_failures: Annotated[
        str | None, Parameter(converter=max_failures_share, metavar="N|P%")
    ] = None,
    timeout: Annotated[float | None, Parameter(converter=duration, metavar="DURATION")] = None,
    retries: int = 0,
    env: Annotated[
        list[str] | None, Parameter(negative=(), converter=env_pairs, metavar="NAME=VALUE")
    ] = None,
    secret_env: Annotated[
        list[str] | None, Parameter(negative=(), converter=secret_names, metavar="NAME")
    ] = None,
    name: str | None = None,
    no_move: Flag = False,
    on_lost: Annotated[
        str, Parameter(converter=on_lost_choice, metavar="move|wait|fail", show_default=False)
    ] = DEFAULT_ON_LOST,
    lost_after: Annotated[
        float | None,
        Parameter(converter=lost_after_duration, metavar="DURATION", show_default=False),
    ] = None,
    queue_timeout: Annotated[
        float, Parameter(converter=duration, metavar="DURATION", show_default=False)
    ] = DEFAULT_QUEUE_TIMEOUT,
    memory: Annotated[int | None, Parameter(converter=size_bytes, metavar="SIZE")] = None,
    cpu: Annotated[float | None, Parameter(converter=cpus, metavar="FRACTION")] = None,
    max_processes: Annotated[int | None, Parameter(metavar="N")] = None,
    max_open_files: Annotated[int | None, Parameter(metavar="N")] = None,
    max_address_space: Annotated[
        int | None, Parameter(converter=size_bytes, metavar="SIZE")
    ] = None,
    file: Annotated[list[str] | None, Parameter(negative=(), metavar="SRC[:NAME]")] = None,
    detach: Flag = False,
    output: Annotated[OutputMode, Parameter(show_default=False)] = "raw",
    progress: bool | None = None,
    json: Annotated[
        bool,
        Parameter(
            name="--json",
            negative=(),
            help="With --detach: the job as JSON. Else: follow it and print its recap as"
            " JSON once it ends (its output is not printed: `job logs`).",
        ),
    ] = False,
    context: ContextPath = None,
) -> int:
    """Run a command on a node of the fleet (put it after --) and follow it.

    Without --detach: prints the command's output as it comes (stdout to stdout, stderr to
    stderr) and exits with its exit code; a job that ends another way (lost, cancelled,
    timed out, never placed) prints one line saying why and exits 1. Ctrl-C leaves the job
    running. A job on many nodes (--all) shows, when stderr is a terminal, one live line of
    where its parts are, and a recap when it ends.

    Parameters
    ----------
    command
        The command and its arguments, after --; run as is, without a shell.
    tenant
        The tenant whose nodes may run it.
    selector
        KEY=VALUE: only nodes with this label; repeat for several (all must match).
    node
        Only this node (node-...).
    all
        Once on every node that matches now; such a job is not moved.
    batch
        With --all: a rolling batch, at most N nodes (or P% of the matching nodes, at
        least 1) at once; as one ends the next starts.
    batch_wait
        With --batch: rest this long after a node's part ends before its slot takes the
        next node, such as 30s. [default: 0]
    max_failures
        With --batch: once more than N parts (or P% of them) have failed, start no new
        part; those running finish and the job fails. [default: no limit]
    timeout
        Stop an attempt running longer, such as 90s, 5m or 1h30m (default: no limit).
    retries
        Run the command again this many times when it fails (moves do not count).
    env
        NAME=VALUE for the command's environment; repeat for several. Not secret: stored
        and shown in clear; use --secret-env for passwords and keys.
    secret_env
        NAME: a secret for the command's environment, its value taken from this
        environment (export it first); repeat for several. Sealed, given to the command's
        process only, never shown, deleted when the job ends.
    name
        A name to recognise the job by.
    no_move
        A blocked, purged or lost node's attempt ends the job lost instead of moving it.
    on_lost
        When the node running it is lost (no server has heard from it for --lost-after):
        move the job to another node (the default), wait for the node to come back
        (moved once --lost-after has passed), or fail the job. A node that comes back
        after its attempt moved or failed stops it. [default: move]
    lost_after
        How long a node may be unheard of before it is lost, from 5s to 7d. [default: 15s;
        10m with --on-lost wait]
    queue_timeout
        Fail the job if no node can take it for this long. [default: 10m]
    memory
        Memory for each attempt's processes together, such as 512M or 2G (a cgroup where
        the node has one; `job show` says what each node applied).
    cpu
        CPU time for each attempt, in CPUs: 0.5 is half of one CPU (a cgroup where the
        node has one).
    max_processes
        Processes and threads each attempt may have at once (a cgroup where the node has
        one).
    max_open_files
        Files each process may hold open, from 16 (an rlimit).
    max_address_space
        Virtual memory each process may map, such as 4G (an rlimit).
    file
        SRC[:NAME]: put this local file in each attempt's working directory, as NAME
        (default: its own name), before the command starts; repeat for several. Stored in
        the cluster, checked by its SHA-256 on the node (docs/files.md).
    detach
        Print the job ID and leave it running.
    output
        How the output of its nodes is laid out: raw (as it comes, byte for byte), prefixed
        (each line behind its node's ID) or grouped (each node's output in one block when
        its part ends). [default: raw]
    progress
        Show the live line of where the parts are (on stderr) and the recap at the end;
        --no-progress: neither. [default: when stderr is a terminal and the job runs on
        many nodes (--all)]
    """
    # Every option of the job itself, as `schedule create` takes them too (job_body).
    options = {k: v for k, v in locals().items() if k not in _NOT_THE_JOBS}
    if detach and (output != "raw" or progress is not None):
        flag = "--output" if output != "raw" else "--progress"
        raise usage_error(f"{flag} does not go with --detach: it is how a followed job shows")
    if json and not detach and output != "raw":
        raise usage_error(
            "--output does not go with --json: a followed job's --json prints its recap only"
        )
    body = job_body(command, options)
    client = ApiClient(select(context))
    if file:
        body["files"] = placed_files(client, tenant, file)
    try:
        job = client.post("/api/v1/jobs", body)
    except KeyboardInterrupt:
        warn(
            "interrupted: the job may have been created; see `orchestrator-zero job list`"
            f"{_context_arg(context)}"
        )
        return 130
    if detach:
        if json:
            print_json(job)
        else:
            print(terminal_safe(job["id"]))
        return 0
    shown = Shown.of(output, progress, json, many=bool(body["all"]))
    return _follow(
        client, job["id"], context, headers="moves", only_attempt=None, run=True, shown=shown
    )


@app.command(name="list")
def list_(
    *,
    tenant: TenantOption = None,
    state: str | None = None,
    schedule: ScheduleOption = None,
    limit: int = 50,
    json: JsonFlag = False,
    context: ContextPath = None,
) -> int:
    """The newest jobs, newest first.

    Parameters
    ----------
    tenant
        Only jobs of this tenant.
    state
        queued, running, succeeded, failed, cancelled or lost.
    schedule
        Only the runs of this schedule (sched-...).
    limit
        At most this many jobs.
    """
    if limit < 1:
        raise usage_error(f"invalid --limit {limit}: give 1 or more")
    found = ApiClient(select(context)).get(
        "/api/v1/jobs", {"tenant": tenant, "state": state, "schedule": schedule, "limit": limit}
    )
    jobs = found["jobs"]
    if json:
        print_json(jobs)
        return 0
    print_table(
        ["ID", "STATE", "TENANT", "NODE(S)", "EXIT", "CREATED", "COMMAND"],
        [
            [j["id"], j["state"], j["tenant"], _nodes(j), _exit(j["exit_code"]),
             _time(j["created_at"]), _short(_command(j["command"]))]
            for j in jobs
        ],
    )  # fmt: skip
    return 0


@app.command
def show(job_id: JobId, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """One job in detail, with its attempts."""
    path = f"/api/v1/jobs/{check_job_id(job_id)}"
    client = ApiClient(select(context))
    job = client.get(path)
    if json:
        print_json(job)
        return 0
    asked = job.get("limits") or {}  # a server older than limits sends none
    print_fields(
        [
            ("id", job["id"]),
            ("name", job["name"] or "-"),
            ("state", job["state"]),
            ("reason", job["reason"] or "-"),
            ("tenant", job["tenant"]),
            ("command", _command(job["command"])),
            ("selector", _labels(job["selector"]) or "-"),
            ("node", job["node"] or "-"),
            ("all", "yes" if job["all"] else "no"),
            *_batch_fields(job),
            ("moves", "no (--no-move)" if job["no_move"] else "yes"),
            ("retries", job["retries"]),
            ("timeout", _seconds(job["timeout"]) if job["timeout"] is not None else "none"),
            ("queue timeout", _seconds(job["queue_timeout"])),
            ("if its node is lost", _on_lost(job)),
            ("env", ",".join(job["env"]) or "-"),
            ("limits", job_limits.describe(asked)),
            ("secrets", ",".join(job.get("secret_env", [])) or "-"),
            ("exit code", _exit(job["exit_code"])),
            ("created", f"{_time(job['created_at'])} by {job['created_by']}"),
            ("started", _time(job["started_at"])),
            ("ended", _time(job["ended_at"])),
        ]
    )
    attempts = job["attempts"]
    print()
    if not attempts:
        print("no attempts yet")
        return 0
    print_table(
        ["ATTEMPT", "NODE", "STATE", "STARTED", "ENDED", "EXIT", "ENDED BECAUSE", "OUTPUT"],
        [
            [a["number"], a["node"], a["state"], _time(a["started_at"]), _time(a["ended_at"]),
             _exit(a["exit_code"]), a["ended_because"] or "-", _output(a)]
            for a in attempts
        ],
    )  # fmt: skip
    _print_details(attempts)
    if job["command"][:1] == [PUSH]:
        # A file push: what each node's agent said (written, unchanged or the error).
        print()
        pushed = push_results(client, job)
        print_table(
            ["ATTEMPT", "NODE", "FILE"], [[r["attempt"], r["node"], r["result"]] for r in pushed]
        )
    _print_applied(asked, attempts)
    return 0


@app.command
def logs(
    job_id: JobId,
    /,
    *,
    attempt: int | None = None,
    follow: Flag = False,
    context: ContextPath = None,
) -> int:
    """A job's output: every attempt's, each headed on stderr by its attempt and node.

    The command's stdout goes to stdout and its stderr to stderr, byte for byte; the
    headers go to stderr, so `job logs ID > out` holds only what the command printed.

    Parameters
    ----------
    attempt
        Only this attempt's output (1 is the first).
    follow
        Keep printing until the job ends, then exit as `job run` does.
    """
    check_job_id(job_id)
    if attempt is not None and attempt < 1:
        raise usage_error(f"invalid --attempt {attempt}: attempts are numbered from 1")
    client = ApiClient(select(context))
    if follow:
        return _follow(client, job_id, context, headers="always", only_attempt=attempt, run=False)
    follower = _follower(client, job_id, headers="always", only_attempt=attempt)
    try:
        follower.run(follow=False)
    except BrokenPipeError:
        return _stdout_closed()
    return 0


@app.command
def cancel(job_id: JobId, /, *, json: JsonFlag = False, context: ContextPath = None) -> int:
    """Stop a job: its running attempts' processes are killed (SIGTERM, SIGKILL after 3 s)."""
    path = f"/api/v1/jobs/{check_job_id(job_id)}/cancel"
    job = ApiClient(select(context)).post(path, {})
    if json:
        print_json(job)
    else:
        print(terminal_safe(f"job {job['id']}: cancel requested ({job['state']})"))
    return 0


def output_fetch(
    client: ApiClient, job_id: str, only_attempt: int | None = None
) -> Callable[[int, int, str | None], dict[str, Any]]:
    """The page fetch of a Follower of JOB_ID's output through CLIENT (bench/ uses it too)."""
    path = f"/api/v1/jobs/{job_id}/output"

    def fetch(after: int, wait: int, seen: str | None) -> dict[str, Any]:
        query: dict[str, Any] = {"after": after, "attempt": only_attempt}
        if not wait:
            page: dict[str, Any] = client.get(path, query)
            return page
        # A long poll: the read deadline outlasts the wait the server may take.
        query |= {"wait": wait, "seen": seen}
        page = client.get(path, query, read_timeout=wait + TIMEOUT)
        return page

    return fetch


def _follower(
    client: ApiClient,
    job_id: str,
    *,
    headers: str,
    only_attempt: int | None,
    sink: Sink | None = None,
    node_headers: bool = True,
) -> Follower:
    return Follower(
        output_fetch(client, job_id, only_attempt),
        sys.stdout.buffer,
        sys.stderr.buffer,
        headers=headers,
        only_attempt=only_attempt,
        sink=sink,
        node_headers=node_headers,
    )


def _follow(
    client: ApiClient,
    job_id: str,
    context: Path | None,
    *,
    headers: str,
    only_attempt: int | None,
    run: bool,
    shown: Shown | None = None,
) -> int:
    """Follow JOB_ID to its end and exit as its command did; Ctrl-C leaves it running."""
    sys.stdout.flush()
    view = None if shown is None or shown.plain else shown.view(job_id)
    follower = _follower(
        client,
        job_id,
        headers=headers,
        only_attempt=only_attempt,
        sink=view,
        # Laid out by node, or not shown: the lines naming each node's attempt say nothing.
        node_headers=shown is None or (shown.output == "raw" and not shown.json),
    )
    try:
        job = follower.run(follow=True)
    except KeyboardInterrupt:
        _stop(view, flush=True)
        _still_running(job_id, context, "interrupted")
        return 130
    except BrokenPipeError:
        _stop(view, flush=False)
        code = _stdout_closed()
        if run:
            _still_running(job_id, context, "output closed")
        return code
    except ApiError as e:
        _stop(view, flush=True)
        raise ApiError(
            f"{e}; job {job_id} may still be running: follow it with"
            f" `orchestrator-zero job logs {job_id} --follow{_context_arg(context)}`"
        ) from None
    except BaseException:
        _stop(view, flush=False)
        raise
    if not _stop(view, flush=True):
        return _stdout_closed()
    if job.get("state") not in ENDED_STATES:
        raise ApiError(f"the server said job {job_id} ended but it is {job.get('state')}")
    code, line = outcome(job)
    if shown is not None and shown.json:
        print_json(recap_json(job))
    elif shown is not None and shown.recap:
        for recap_line in recap_lines(job):
            print(recap_line, file=sys.stderr)
    if line is not None:
        print(line, file=sys.stderr)
    return code


def _stop(view: View | None, *, flush: bool) -> bool:
    """Let out what the view holds (unless FLUSH is false: our stdout is gone) and wipe its
    live line; false if the reader of our stdout went away meanwhile."""
    if view is None:
        return True
    try:
        view.stop(flush=flush)
    except BrokenPipeError:
        return False
    return True


def _still_running(job_id: str, context: Path | None, why: str) -> None:
    extra = _context_arg(context)
    warn(f"{why}; job {job_id} keeps running")
    warn(f"  follow it: orchestrator-zero job logs {job_id} --follow{extra}")
    warn(f"  cancel it: orchestrator-zero job cancel {job_id}{extra}")


def _stdout_closed() -> int:
    """The reader of our stdout went away (`| head`): exit quietly, as SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's last flush does not fail
    return 141


def _context_arg(context: Path | None) -> str:
    return f" --context {shlex.quote(str(context))}" if context is not None else ""


def _print_details(attempts: list[dict[str, Any]]) -> None:
    """Per attempt its node failed, the node's words on why (`node could not record the
    attempt`: which file, and that its disk is full). A server older than the detail
    sends none."""
    lines = [
        f"attempt {a['number']} on {a['node']}: {a['ended_detail']}"
        for a in attempts
        if a.get("ended_detail")
    ]
    if lines:
        print()
    for line in lines:
        print(terminal_safe(line))


def _print_applied(asked: dict[str, Any], attempts: list[dict[str, Any]]) -> None:
    """Per attempt, what its node said it applied (as which user, how it tracked the
    processes, each limit and how)."""
    lines = job_limits.applied_lines(
        asked, [(a["number"], a["state"] == "running", a.get("applied")) for a in attempts]
    )
    if lines:
        print()
    for line in lines:
        print(terminal_safe(line))


def _batch_fields(job: dict[str, Any]) -> list[tuple[str, Any]]:
    """`job show`'s lines for an --all job: its batch, and its parts by state."""
    if not job["all"]:
        return []
    batch = job.get("batch")  # a server older than batches sends neither
    fields: list[tuple[str, Any]] = [
        (
            "batch",
            describe_batch(None, 0, None)
            if batch is None
            else describe_batch(batch["size"], batch["wait"], batch["max_failures"]),
        )
    ]
    parts = job.get("parts")
    if parts:
        fields.append(
            (
                "parts",
                f"{parts['total']}: {parts['waiting']} waiting, {parts['running']} running,"
                f" {parts['ended']} ended, {parts['not_started']} not started",
            )
        )
        if parts["waiting_nodes"]:
            fields.append(("waiting", _few(parts["waiting_nodes"])))
    return fields


def _few(names: list[str], shown: int = 5) -> str:
    more = len(names) - shown
    return ",".join(names[:shown]) + (f" and {more} more" if more > 0 else "")


def _on_lost(job: dict[str, Any]) -> str:
    # A server older than on_lost sends neither: its jobs move after the old 10 s.
    if "on_lost" not in job:
        return "move after 10 s"
    return describe_on_lost(str(job["on_lost"]), job.get("lost_after"))


def _command(argv: list[str]) -> str:
    return shlex.join(argv)


def _short(text: str) -> str:
    return text if len(text) <= COMMAND_WIDTH else text[: COMMAND_WIDTH - 3] + "..."


def _labels(labels: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _nodes(job: dict[str, Any]) -> str:
    attempts = job["attempts"]
    if not attempts:
        return "-"
    if job["all"]:
        nodes_ = sorted({a["node"] for a in attempts})
        return nodes_[0] if len(nodes_) == 1 else f"{len(nodes_)} nodes"
    return str(attempts[-1]["node"])


def _exit(code: int | None) -> str:
    return "-" if code is None else str(code)


def _output(attempt: dict[str, Any]) -> str:
    size = f"{attempt['output_bytes']} B"
    return f"{size} (truncated)" if attempt["truncated"] else size


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _time(iso: str | None) -> str:
    if iso is None:
        return "-"
    return dt.datetime.fromisoformat(iso).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


# `job run`'s own parameters that are not the job's: how the command line follows it.
_NOT_THE_JOBS = frozenset({"command", "detach", "json", "context", "file", "output", "progress"})


def job_body(command: Sequence[str], options: Mapping[str, Any]) -> dict[str, Any]:
    """The API's job body (oz0.jobs.spec.JobSpec) from `job run`'s COMMAND and OPTIONS (its
    parameters by name, each given or its default): checked here as far as the command
    line can, so a mistake is one line before anything is sent. `schedule create` takes
    the same options, parsed by `job run`'s own signature (cli/schedule_cmds.py)."""
    o = options
    tenant, selector, node, all = o["tenant"], o["selector"], o["node"], o["all"]
    timeout, retries, env, name = o["timeout"], o["retries"], o["env"], o["name"]
    no_move, on_lost, lost_after = o["no_move"], o["on_lost"], o["lost_after"]
    batch, batch_wait, max_failures = o["batch"], o["batch_wait"], o["max_failures"]
    queue_timeout, secret_env = o["queue_timeout"], o["secret_env"]
    memory, cpu, max_processes = o["memory"], o["cpu"], o["max_processes"]
    max_open_files, max_address_space = o["max_open_files"], o["max_address_space"]
    if not command:
        raise usage_error("job run needs a command after --, such as: -- uptime")
    if node is not None:
        try:
            node_rules.check_node_id(node)
        except node_rules.NodeError as e:
            raise usage_error(str(e)) from None
        if all:
            raise usage_error("--node and --all cannot go together: --node picks one node")
    if batch is not None and not all:
        raise usage_error(
            "--batch goes with --all: a rolling batch runs the command on every matching"
            " node, a few at a time"
        )
    for flag, given in (("--batch-wait", batch_wait), ("--max-failures", max_failures)):
        if given is not None and batch is None:
            raise usage_error(f"{flag} goes with --batch: without it every node starts at once")
    if retries < 0:
        raise usage_error(f"invalid --retries {retries}: give 0 or more")
    limits: dict[str, int | float] = {}
    for flag, limit, value in (
        ("--memory", "memory", memory),
        ("--cpu", "cpu", cpu),
        ("--max-processes", "max_processes", max_processes),
        ("--max-open-files", "max_open_files", max_open_files),
        ("--max-address-space", "address_space", max_address_space),
    ):
        if value is not None:
            try:
                limits[limit] = job_limits.check_one(limit, value)
            except ValueError as e:
                raise usage_error(f"{flag}: {e}") from None
    # Read before anything is sent: a name not set sends nothing.
    secrets = secret_values(secret_env or [], os.environ)
    body: dict[str, Any] = {
        "tenant": tenant,
        "command": list(command),
        "selector": parse_selector(selector or []),
        "node": node,
        "all": all,
        "timeout": timeout,
        "retries": retries,
        "env": parse_env(env or []),
        "name": name,
        "no_move": no_move,
        "queue_timeout": queue_timeout,
    }
    if limits:  # only when asked: a server without limits refuses the field
        body["limits"] = limits
    if on_lost != DEFAULT_ON_LOST:  # the same: an older server refuses what it lacks
        body["on_lost"] = on_lost
    if lost_after is not None:
        body["lost_after"] = lost_after
    if batch is not None:  # only when asked: an older server refuses what it lacks
        body["batch"] = batch
        if batch_wait:
            body["batch_wait"] = batch_wait
        if max_failures is not None:
            body["max_failures"] = max_failures
    if secrets:
        body["secret_env"] = secrets
    return body
