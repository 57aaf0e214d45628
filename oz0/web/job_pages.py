"""/jobs: the list (filters and pages in the URL), a job with its attempts and output
(jobs.js follows a running one through /jobs/<id>/live.json), cancelling one, and
/jobs/new, the form that runs one.

The form is read into the API's JSON body and checked by the same JobSpec.from_json; jobs
are made and cancelled by the same oz0.jobs.store functions, with the actor `ui:<account>`,
and the job sweeper is kicked as the API kicks it.
"""

from __future__ import annotations

import datetime as dt
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final

from quart import Blueprint, Response, jsonify, request
from werkzeug.datastructures import MultiDict

from oz0 import access, nodes, tenants
from oz0.jobs import follow, store
from oz0.jobs import limits as job_limits
from oz0.jobs.secret_env import SecretKeeper
from oz0.jobs.spec import (
    STATES,
    JobEnded,
    JobError,
    JobNotFound,
    JobSpec,
    TooManyQueued,
    is_job_id,
)
from oz0.jobs.spec_text import (
    describe_batch,
    describe_on_lost,
    parse_batch,
    parse_batch_wait,
    parse_duration,
    parse_env,
    parse_lost_after,
    parse_max_failures,
    parse_on_lost,
    parse_selector,
)
from oz0.ui_sessions import Session
from oz0.web import paging
from oz0.web.form_fields import form_lines, whole_number
from oz0.web.pages import Page, Pages, Refused, text_arg

# A job page shows at most this much output, in at most this many chunks (a node may have
# sent many tiny ones); the rest is for `orchestrator-zero job logs`.
SHOWN_OUTPUT = 2 * 1024 * 1024
SHOWN_CHUNKS = 5000
# Chunks a poll of live.json answers at most (and at most store.PAGE_BYTES); the next poll
# takes the rest.
LIVE_CHUNKS = 500
COMMAND_WIDTH = 60
DEFAULT_QUEUE_TIMEOUT = "10m"
# The run form's secret fields (name and value): as many as the form shows.
SECRET_FIELDS = 3
# As the `m.when` macro shows a time.
_WHEN = "%Y-%m-%d %H:%M:%S"

# What `?done=KEY` shows after this module's actions (composed into the pages' table: routes.py).
NOTICES: Final[Mapping[str, str]] = MappingProxyType(
    {
        "job.started": "Job created; it runs on a matching node as soon as one is free.",
        "job.cancel": "Cancel requested: the job's processes are being stopped.",
    }
)


@dataclass
class Piece:
    stream: str
    data: bytearray

    @property
    def text(self) -> str:
        return self.data.decode("utf-8", errors="replace")


@dataclass
class AttemptOutput:
    """One attempt's output as its page shows it: runs of one stream, in order."""

    number: int
    node: str
    pieces: list[Piece] = field(default_factory=list)
    truncated: bool = False

    def add(self, stream: str, data: bytes) -> None:
        # Consecutive chunks of a stream are joined before decoding, so a character
        # split between two chunks is not shown as two replacement marks.
        if self.pieces and self.pieces[-1].stream == stream:
            self.pieces[-1].data += data
        else:
            self.pieces.append(Piece(stream, bytearray(data)))


def command_text(argv: list[str]) -> str:
    return shlex.join(argv)


def short(text: str, width: int = COMMAND_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def when(at: dt.datetime | None) -> str | None:
    return at.strftime(_WHEN) if at else None


def applied_lines(job: store.Job) -> list[str]:
    """What each attempt's node applied (limits.py), one line an attempt; none for a job
    without limits whose nodes said nothing."""
    return job_limits.applied_lines(
        job.limits, [(a.number, a.state == "running", a.applied) for a in job.attempts]
    )


def job_nodes(job: store.Job) -> list[str]:
    """The nodes the job ran on, in order, each once."""
    return list(dict.fromkeys(a.node for a in job.attempts))


def parts_text(job: store.Job) -> str | None:
    """An --all job's parts by state, as the job page shows them (None for one node)."""
    parts = job.parts_json()
    if parts is None:
        return None
    return (
        f"{parts['total']}: {parts['waiting']} waiting, {parts['running']} running,"
        f" {parts['ended']} ended, {parts['not_started']} not started"
    )


def spec_from_form(form: MultiDict[str, str]) -> JobSpec:
    """The run form as the API's JSON body, checked by JobSpec.from_json; JobError or
    ValueError with one line saying which field is wrong."""
    return JobSpec.from_json(body_from_form(form))


def body_from_form(form: MultiDict[str, str]) -> dict[str, Any]:
    """The run form's fields as the API's JSON body (the Schedules page's job fields too);
    JobError naming the field that does not parse."""
    command_line = form.get("command", "").strip()
    if not command_line:
        raise JobError("Command: give the program to run and its arguments, such as uptime")
    try:
        command = shlex.split(command_line)
    except ValueError as e:
        raise JobError(f"Command: {e} (quote as a shell would)") from None
    body: dict[str, Any] = {
        "tenant": form.get("tenant", nodes.DEFAULT_TENANT),
        "command": command,
        "selector": _field("Selector", parse_selector, form_lines(form.get("selector", ""))),
        "all": form.get("all") == "on",
        "retries": whole_number(form.get("retries", "0") or "0"),
        "env": _field("Environment", parse_env, form_lines(form.get("env", ""))),
        "name": form.get("name", "").strip() or None,
        "queue_timeout": _field(
            "Queue timeout", parse_duration, form.get("queue_timeout", "") or DEFAULT_QUEUE_TIMEOUT
        ),
    }
    timeout = form.get("timeout", "").strip()
    if timeout:
        body["timeout"] = _field("Timeout", parse_duration, timeout)
    body["on_lost"] = _field("If its node is lost", parse_on_lost, form.get("on_lost", "move"))
    lost_after = form.get("lost_after", "").strip()
    if lost_after:
        body["lost_after"] = _field("Lost after", parse_lost_after, lost_after)
    # A rolling batch; JobSpec refuses its wait or failures without it, and it without all.
    for key, label, parse in (
        ("batch", "Batch", parse_batch),
        ("batch_wait", "Batch wait", parse_batch_wait),
        ("max_failures", "Max failures", parse_max_failures),
    ):
        text = form.get(key, "").strip()
        if text:
            body[key] = _field(label, parse, text)
    limits: dict[str, int | float] = {}
    memory, cpu = form.get("memory", "").strip(), form.get("cpu", "").strip()
    if memory:
        limits["memory"] = _field("Memory", job_limits.parse_size, memory)
    if cpu:
        limits["cpu"] = _field("CPU", job_limits.parse_cpu, cpu)
    if limits:
        body["limits"] = limits
    body["secret_env"] = secrets_from_form(form)
    return body


def secrets_from_form(form: MultiDict[str, str]) -> dict[str, str]:
    """The secret fields' NAME: VALUE pairs (rows left blank skipped); JobError naming the
    field, never its value."""
    secrets: dict[str, str] = {}
    names, values = form.getlist("secret_name"), form.getlist("secret_value")
    for name, value in zip(names, values, strict=False):
        name = name.strip()
        if not name and not value:
            continue
        if not name:
            raise JobError("Secrets: a secret value needs its variable's name")
        if name in secrets:
            raise JobError(f"Secrets: {name} is given more than once")
        secrets[name] = value
    return secrets


def _secret_names(form: MultiDict[str, str]) -> list[str]:
    """The names to show again in the secret fields (SECRET_FIELDS of them, blank ones
    too); their values are never sent back: the form asks for them again."""
    names = [n.strip() for n in form.getlist("secret_name")][:SECRET_FIELDS]
    return names + [""] * (SECRET_FIELDS - len(names))


def _field(name: str, parse: Any, value: Any) -> Any:
    try:
        return parse(value)
    except ValueError as e:
        raise JobError(f"{name}: {e}") from None


def output_of(conn: store.Conn, job: store.Job) -> tuple[list[AttemptOutput], int, bool]:
    """The job's output by attempt, the cursor after the last chunk read, and whether
    SHOWN_OUTPUT or SHOWN_CHUNKS cut it short."""
    by_attempt = {
        a.number: AttemptOutput(a.number, a.node, truncated=a.truncated) for a in job.attempts
    }
    cursor, size, count = 0, 0, 0
    more = True
    while more and size < SHOWN_OUTPUT and count < SHOWN_CHUNKS:
        page = store.output_page(
            conn, job.id, after=cursor, limit=SHOWN_CHUNKS - count, max_bytes=SHOWN_OUTPUT - size
        )
        for c in page.chunks:
            shown = by_attempt.setdefault(c.attempt, AttemptOutput(c.attempt, c.node))
            shown.add(c.stream, c.data)
            shown.truncated = shown.truncated or c.truncated
            size += len(c.data)
            cursor = c.cursor
        count += len(page.chunks)
        more = page.more
    return sorted(by_attempt.values(), key=lambda a: a.number), cursor, more


def live_json(job: store.Job, page: store.OutputPage, after: int) -> dict[str, Any]:
    """What jobs.js updates a running job's page from."""
    return {
        "state": job.state,
        "ended": job.ended,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "started": when(job.started_at),
        "ended_at": when(job.ended_at),
        "attempts": [
            {
                "number": a.number,
                "node": a.node,
                "state": a.state,
                "exit_code": a.exit_code,
                "started": when(a.started_at),
                "ended": when(a.ended_at),
                "ended_because": a.ended_because,
                # The node's words on why it failed it (shown on hover).
                "ended_detail": a.ended_detail,
                "truncated": a.truncated,
            }
            for a in job.attempts
        ],
        "applied": applied_lines(job),
        "parts": parts_text(job),
        "chunks": [c.to_json() for c in page.chunks],
        "cursor": page.cursor or after,
        "more": page.more,
    }


def add(web: Blueprint, pages: Pages) -> None:
    db = pages.state.db

    async def tenant_names(session: Session) -> list[str]:
        """The tenants the person may pick (its own; every one for a cluster-wide person)."""
        scope = session.person.scope
        return await db.transaction(
            lambda conn: [t.name for t in tenants.list_tenants(conn, scope=scope)]
        )

    @web.get("/jobs")
    async def jobs_page() -> Page:
        session = await pages.session()
        filters = {name: text_arg(request.args, name) for name in ("state", "tenant")}
        page = paging.page_number()
        error = None
        if filters["state"] is not None and filters["state"] not in STATES:
            error = f"unknown job state {filters['state']!r}: one of {', '.join(STATES)}"
            filters["state"] = None

        def read(conn: store.Conn) -> list[store.Job]:
            return store.list_jobs(
                conn, tenant=filters["tenant"], state=filters["state"],
                limit=paging.ROWS + 1, offset=(page - 1) * paging.ROWS,
                scope=session.person.scope,
            )  # fmt: skip

        found = await db.transaction(read)
        newer, older = paging.links(pages, page, len(found) > paging.ROWS)
        return await pages.render(
            "jobs.html", session, 400 if error else 200, jobs=found[: paging.ROWS],
            filters=filters, states=STATES, tenants=await tenant_names(session), error=error,
            newer=newer, older=older, command_text=command_text, short=short,
            job_nodes=job_nodes,
        )  # fmt: skip

    async def run_form(
        session: Session, form: MultiDict[str, str], status: int = 200, error: str | None = None
    ) -> Page:
        return await pages.render(
            "job_new.html", session, status, form=form, error=error,
            tenants=await tenant_names(session), default_queue_timeout=DEFAULT_QUEUE_TIMEOUT,
            secret_names=_secret_names(form),
        )  # fmt: skip

    @web.get("/jobs/new")
    async def new_job() -> Page:
        return await run_form(await pages.session(), MultiDict())

    @web.post("/jobs")
    async def run_job() -> Page:
        session, form = await pages.posted()
        try:
            spec = spec_from_form(form)
            session.person.check(access.Right.OPERATE, "run jobs", tenant=spec.tenant)
            keeper = SecretKeeper.of(pages.state.cluster)
            job = await db.transaction(lambda conn: store.create(conn, spec, session.actor, keeper))
        except access.Forbidden as e:
            raise Refused(str(e)) from None
        except TooManyQueued as e:
            return await run_form(session, form, 429, str(e))
        except JobError as e:
            return await run_form(session, form, 400, str(e))
        pages.state.kick_jobs()
        return pages.done(f"/jobs/{job.id}", "job.started")

    async def job_page(session: Session, job_id: str, status: int = 200, error: str = "") -> Page:
        if not is_job_id(job_id):
            return await pages.missing(session, f"job {job_id}")

        reads_output = session.person.has(access.Right.READ_OUTPUT)

        def read(conn: store.Conn) -> tuple[store.Job, list[AttemptOutput], int, bool]:
            # The job first: once it has ended, its output is complete.
            job = store.get(conn, job_id, scope=session.person.scope)
            return (job, *output_of(conn, job)) if reads_output else (job, [], 0, False)

        try:
            job, output, cursor, cut = await db.transaction(read)
        except JobNotFound:
            return await pages.missing(session, f"job {job_id}")
        return await pages.render(
            "job.html", session, status, job=job, output=output, cursor=cursor, cut=cut,
            error=error or None, command_text=command_text, shown_limit=SHOWN_OUTPUT,
            shown_chunks=SHOWN_CHUNKS, output_cap=store.OUTPUT_CAP,
            limits_text=job_limits.describe(job.limits), applied=applied_lines(job),
            on_lost_text=describe_on_lost(job.on_lost, job.lost_after),
            batch_text=describe_batch(job.batch, job.batch_wait, job.max_failures),
            parts_text=parts_text(job),
        )  # fmt: skip

    @web.get("/jobs/<job_id>")
    async def job_show(job_id: str) -> Page:
        return await job_page(await pages.session(), job_id)

    @web.get("/jobs/<job_id>/live.json")
    async def job_live(job_id: str) -> Page | tuple[Response, int]:
        session = await pages.session()
        scope = session.person.scope
        # The job's state is READ; its output only for a role that may read output.
        reads_output = session.person.has(access.Right.READ_OUTPUT)
        if not is_job_id(job_id):
            return jsonify({"error": f"no job {job_id}"}), 404
        try:
            after = max(0, int(request.args.get("after", "0")))
            # As the API's output page: seconds to wait for news when there is none yet.
            wait = int(request.args.get("wait", "0"))
        except ValueError:
            return jsonify({"error": "after and wait must be whole numbers"}), 400
        if not 0 <= wait <= follow.MAX_WAIT:
            return jsonify({"error": f"wait must be between 0 and {follow.MAX_WAIT}"}), 400

        def read(conn: store.Conn) -> tuple[store.Job, store.OutputPage]:
            job = store.get(conn, job_id, scope=scope)
            if not reads_output:
                return job, store.OutputPage([], more=False)
            return job, store.output_page(conn, job_id, after=after, limit=LIVE_CHUNKS)

        # Any change of the job (an attempt placed or ended, a reason) since the version
        # the page was last given is news, so its attempts and state follow too.
        seen = request.args.get("seen")
        try:
            answer = await follow.read_or_wait(
                pages.state.hub,
                job_id,
                wait,
                lambda: db.transaction(read),
                has_news=lambda found: follow.is_news(*found, seen),
                stopping=pages.state.stopping,
            )
        except JobNotFound as e:
            return jsonify({"error": str(e)}), 404
        job, page = answer.page
        shown = {"waited": answer.waited, "version": follow.version_of(job)}
        return jsonify({**live_json(job, page, after), **shown}), 200

    @web.post("/jobs/<job_id>/cancel")
    async def job_cancel(job_id: str) -> Page:
        session, _ = await pages.posted()
        if not is_job_id(job_id):
            return await pages.missing(session, f"job {job_id}")
        try:
            await db.transaction(
                lambda conn: store.request_cancel(
                    conn, job_id, session.actor, scope=session.person.scope
                )
            )
        except JobNotFound:
            return await pages.missing(session, f"job {job_id}")
        except JobEnded as e:
            return await job_page(session, job_id, 409, str(e))
        pages.state.kick_jobs()
        return pages.done(f"/jobs/{job_id}", "job.cancel")
