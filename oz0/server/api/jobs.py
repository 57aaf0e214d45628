"""POST/GET /api/v1/jobs, GET /api/v1/jobs/<id>, GET /api/v1/jobs/<id>/output,
POST /api/v1/jobs/<id>/cancel."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict, TypeVar

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import access
from oz0.jobs import follow, store
from oz0.jobs.secret_env import SecretKeeper
from oz0.jobs.spec import (
    JobBody,
    JobEnded,
    JobError,
    JobNotFound,
    JobSpec,
    TooManyQueued,
    is_job_id,
)
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described

T = TypeVar("T")
JOB_ID = {"type": "string", "pattern": "^job-[0-9a-f]{12}$"}
_JOB_ID = {"job_id": JOB_ID}
_NOT_FOUND = {404: "no such job (or another tenant's)"}


class JobQuery(TypedDict, total=False):
    tenant: str
    state: str
    # A schedule's runs.
    schedule: str
    limit: int


class Jobs(TypedDict):
    jobs: list[store.JobJson]


class OutputQuery(TypedDict, total=False):
    # The cursor of the last chunk seen (0: from the start).
    after: int
    limit: int
    # One attempt's output only.
    attempt: int
    # Seconds to wait for news when there is none yet (0: answer at once).
    wait: int
    # The job's version the caller was last shown (`version` of an earlier answer).
    seen: str


class OutputPage(TypedDict):
    chunks: list[store.ChunkJson]
    cursor: int
    more: bool
    ended: bool
    waited: bool
    version: str
    job: store.JobJson


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.post("/api/v1/jobs")
    @described(
        "Run a job", body=JobBody, answers={201: store.JobJson},
        errors={429: "the tenant has as many jobs queued as its cap allows"},
    )  # fmt: skip
    async def job_run() -> tuple[Response, int]:
        actor = await operator(state)
        try:
            spec = JobSpec.from_json(await json_object())
        except JobError as e:
            raise ApiError(400, str(e)) from None
        try:
            actor.check(access.Right.OPERATE, "run jobs", tenant=spec.tenant)
        except access.Forbidden as e:
            raise ApiError(403, str(e)) from None
        keeper = SecretKeeper.of(state.cluster)
        job = await _do(state, lambda conn: store.create(conn, spec, actor, keeper))
        state.kick_jobs()
        return jsonify(job.to_json()), 201

    @app.get("/api/v1/jobs")
    @described("Jobs, newest first", query=JobQuery, answers={200: Jobs})
    async def job_list() -> Response:
        scope = (await operator(state)).scope
        tenant, wanted = request.args.get("tenant"), request.args.get("state")
        schedule = request.args.get("schedule")  # a schedule's runs (schedules.py)
        limit = _int_arg("limit", 100, 1, store.MAX_LIST)
        found = await _do(
            state,
            lambda conn: store.list_jobs(
                conn, tenant=tenant, state=wanted, limit=limit, scope=scope, schedule=schedule
            ),
        )
        return jsonify({"jobs": [j.to_json() for j in found]})

    @app.get("/api/v1/jobs/<job_id>")
    @described("A job and its attempts", answers={200: store.JobJson}, path=_JOB_ID,
               errors=_NOT_FOUND)  # fmt: skip
    async def job_show(job_id: str) -> Response:
        scope = (await operator(state)).scope
        _check_id(job_id)
        job = await _do(state, lambda conn: store.get(conn, job_id, scope=scope))
        return jsonify(job.to_json())

    @app.get("/api/v1/jobs/<job_id>/output")
    @described(
        "A page of a job's output after a cursor (waiting for news if asked)",
        query=OutputQuery, answers={200: OutputPage}, path=_JOB_ID, errors=_NOT_FOUND,
    )  # fmt: skip
    async def job_output(job_id: str) -> Response:
        scope = (await operator(state)).scope
        _check_id(job_id)
        after = _int_arg("after", 0, 0, 2**62)
        limit = _int_arg("limit", store.PAGE_CHUNKS, 1, store.MAX_PAGE_CHUNKS)
        attempt_arg = request.args.get("attempt")
        attempt = None if attempt_arg is None else _int_arg("attempt", 1, 1, 1_000_000)
        # Seconds to wait for news when there is none yet (0: answer at once).
        wait = _int_arg("wait", 0, 0, follow.MAX_WAIT)
        # The job's version the caller was last shown: a change since is news too.
        seen = request.args.get("seen")

        def read(conn: store.Conn) -> tuple[store.Job, store.OutputPage]:
            # The job first: once it has ended, its output is complete (the node's last
            # chunk is stored before its attempt can end), so no chunk is missed. Another
            # tenant's job than the caller's is not found, so neither is its output.
            job = store.get(conn, job_id, scope=scope)
            return job, store.output_page(conn, job_id, after=after, attempt=attempt, limit=limit)

        answer = await follow.read_or_wait(
            state.hub,
            job_id,
            wait,
            lambda: _do(state, read),
            has_news=lambda found: follow.is_news(*found, seen),
            stopping=state.stopping,
        )
        job, page = answer.page
        return jsonify(
            {
                "chunks": [c.to_json() for c in page.chunks],
                "cursor": page.cursor or after,
                "more": page.more,
                "ended": job.ended,
                # The wait asked was honoured: a client that asked need not sleep before
                # its next request (an older server leaves this out).
                "waited": answer.waited,
                "version": follow.version_of(job),
                "job": job.to_json(),
            }
        )

    @app.post("/api/v1/jobs/<job_id>/cancel")
    @described(
        "Cancel a job", answers={200: store.JobJson}, path=_JOB_ID,
        errors={**_NOT_FOUND, 409: "the job has ended"},
    )  # fmt: skip
    async def job_cancel(job_id: str) -> Response:
        actor = await operator(state)
        _check_id(job_id)
        job = await _do(
            state, lambda conn: store.request_cancel(conn, job_id, actor, scope=actor.scope)
        )
        state.kick_jobs()
        return jsonify(job.to_json())


def _check_id(job_id: str) -> None:
    if not is_job_id(job_id):
        raise ApiError(400, f"invalid job ID {job_id!r}: job IDs look like job-0123456789ab")


def _int_arg(name: str, default: int, low: int, high: int) -> int:
    text = request.args.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ApiError(400, f"{name} must be a whole number") from None
    if not low <= value <= high:
        raise ApiError(400, f"{name} must be between {low} and {high}")
    return value


async def _do(state: ManagementState, work: Callable[[store.Conn], T]) -> T:
    try:
        return await state.db.transaction(work)
    except JobNotFound as e:
        raise ApiError(404, str(e)) from None
    except JobEnded as e:
        raise ApiError(409, str(e)) from None
    except TooManyQueued as e:
        raise ApiError(429, str(e)) from None
    except JobError as e:
        raise ApiError(400, str(e)) from None
