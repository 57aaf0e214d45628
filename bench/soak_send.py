"""The soak's workload sent (issue 44): for the run's length, from its seed, the draws of
bench/soak_workload.py at --rate a second: jobs through the management API of the three
servers in turn, every command wrapped by the ledger (bench/soak_ledger.py), cancels
after their delay, and a schedule every minute (deleted at the end); operators' actions
handed to bench/soak_operators.py, sessions to bench/soak_sessions.py; a job's file
stored first and a push followed to its end (bench/soak_files.py). Every change the API
accepted is kept for the audit check.
"""

from __future__ import annotations

import random
import time

import trio

from bench.soak_files import follow_push, store_file
from bench.soak_model import Change
from bench.soak_operators import operator_action
from bench.soak_sessions import session
from bench.soak_state import Soak
from bench.soak_workload import ACTIONS, JobPlan, SessionPlan, draw


async def workload(soak: Soak, nursery: trio.Nursery) -> None:
    rng = random.Random(soak.args.seed * 7919 + 1)
    weights = {**ACTIONS, **soak.args.actions}
    schedule = await soak.call(
        "POST",
        "/api/v1/schedules",
        {
            "job": {
                "tenant": "default",
                "command": soak.ledger.wrapped(["sh", "-c", 'echo "$OZ0_JOB_ID scheduled"']),
                "name": "soak schedule",
            },
            "cron": "* * * * *",
        },
    )
    if schedule is not None:
        soak.schedule_id = str(schedule["id"])
        soak.changes.append(Change("schedule.create", f"schedule:{soak.schedule_id}", 0.0))
    while time.time() < soak.ends:
        await trio.sleep(rng.expovariate(soak.args.rate))
        if time.time() >= soak.ends:
            break
        what = draw(rng, len(soak.fleet.agents), weights)
        soak.actions[what.kind] += 1
        if isinstance(what, JobPlan):
            nursery.start_soon(run_job, soak, what)
        elif isinstance(what, SessionPlan):
            nursery.start_soon(session, soak, what, random.Random(rng.random()))
        else:
            nursery.start_soon(operator_action, soak, what, random.Random(rng.random()))
    if soak.schedule_id is not None:
        gone = await soak.call("DELETE", f"/api/v1/schedules/{soak.schedule_id}")
        if gone is not None:
            soak.changes.append(
                Change("schedule.delete", f"schedule:{soak.schedule_id}", soak.minute())
            )


async def run_job(soak: Soak, job: JobPlan) -> None:
    if job.file is not None and not await store_file(soak, job.file):
        return
    command = job.body["command"]
    body = {**job.body, "command": soak.ledger.wrapped(command) if job.ledgered else command}
    sent = time.time()
    made = await soak.call("POST", "/api/v1/jobs", body)
    if made is None:
        return
    job_id = str(made["id"])
    soak.jobs[job_id] = (job, sent)
    soak.changes.append(Change("job.run", f"job:{job_id}", soak.minute(sent)))
    if job.kind == "file_push":
        await follow_push(soak, job_id, job, sent)
    if job.cancel_after is not None:
        await trio.sleep(job.cancel_after)
        if await soak.call("POST", f"/api/v1/jobs/{job_id}/cancel", {}) is not None:
            soak.changes.append(Change("job.cancel", f"job:{job_id}", soak.minute()))
