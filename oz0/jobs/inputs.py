"""What a job's workflow is started with (workflow.JobInput), from its row: the sweeper
(role.JobsRole) and a schedule's run (schedule_steps.py) start jobs the same way."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial

from oz0 import membership
from oz0.jobs import store
from oz0.jobs.workflow import JobInput, Placed

# The first schema (oz0/store/migrations.py) of a release whose job workers run the
# workflow's database steps as local activities (JobInput.local_steps): a job's workflow
# has them only if every server up is of such a release, since a worker of an older one
# cannot replay its history.
LOCAL_STEPS_SCHEMA = 22
# The first schema of a release whose job workers have the step that looks for attempts
# no node heard of (JobInput.watch_heard, heard.py), and run a job's first attempt placed
# by the server that started the workflow (JobInput.first).
WATCH_HEARD_SCHEMA = FIRST_PLACED_SCHEMA = 24
# The first schema of a release whose job workers run attempts as rows sent over the
# nodes' control streams (JobInput.streamed, oz0/jobs/parts.py) and whose edges send them.
STREAMED_SCHEMA = 25
# The first schema of a release whose job workers know the end reason `node could not
# record the attempt` (JobInput.unrecorded; a worker of an older one could not read it in
# a history) and whose edges keep a node's word on why (job_attempts.ended_detail).
UNRECORDED_SCHEMA = 31


@dataclass(frozen=True)
class Everywhere:
    """What every server up runs, so what a job's workflow may be started with."""

    local_steps: bool
    watch_heard: bool
    first_placed: bool = False
    streamed: bool = False
    unrecorded: bool = False


def everywhere(conn: store.Conn) -> Everywhere:
    """What every server up runs (one query)."""
    at_least = partial(membership.all_at_least, membership.live_schemas(conn))
    return Everywhere(
        at_least(LOCAL_STEPS_SCHEMA),
        at_least(WATCH_HEARD_SCHEMA),
        at_least(FIRST_PLACED_SCHEMA),
        at_least(STREAMED_SCHEMA),
        at_least(UNRECORDED_SCHEMA),
    )


def streaming(conn: store.Conn, jobs: list[store.Job], runs: Everywhere) -> list[store.Job]:
    """JOBS, about to have their workflows started: recorded streaming their attempts if
    every server up runs that (RUNS), in the caller's transaction, so that placement
    (activities.py) and the workflow agree."""
    if not (runs.streamed and runs.local_steps) or not jobs:
        return jobs
    store.set_streamed(conn, [job.id for job in jobs])
    return [dataclasses.replace(job, streamed=True) for job in jobs]


def job_input(job: store.Job, runs: Everywhere, first: Placed | None = None) -> JobInput:
    """JOB's workflow input, with what every server up runs (RUNS) and, if they all run
    it, its FIRST attempt placed already (activities.JobActivities.first_placed)."""
    return JobInput(
        job_id=job.id,
        command=job.command,
        env=job.env,
        timeout=job.timeout,
        retries=job.retries,
        all_nodes=job.all_nodes,
        no_move=job.no_move,
        queue_timeout=job.queue_timeout,
        limits=job.limits,
        on_lost=job.on_lost,
        lost_after=job.lost_after,
        batch=job.batch,
        batch_wait=job.batch_wait,
        max_failures=job.max_failures,
        local_steps=runs.local_steps,
        watch_heard=runs.watch_heard and runs.local_steps,
        first=first if runs.first_placed and runs.local_steps else None,
        # As the job's row says (set as its workflow was claimed to start: role.py), so
        # that the workflow and its placement agree.
        streamed=job.streamed and runs.local_steps,
        unrecorded=runs.unrecorded,
    )
