"""Jobs on real agents: dispatch latency and its path, throughput, jobs at a rate, moves
after a block, output (issues 10, 41).

    python -m bench.jobs [--nodes N] [--dispatch D] [--submitters K] [--throughput M]
                         [--fanouts F] [--paced-rate R] [--paced-seconds S] [--blocks B]
                         [--output-jobs O] [--skip PHASE ...] [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and three real servers on
127.0.0.197, .198 and .199 (default ports); then N real agents
(`python -m oz0_node.main start`, fixtures/agent.py) joined with one unlimited token
(accepted at once), agent i given edge i % 3 first. Every request goes through the
management API with the cluster context's operator (cli.client.ApiClient, what
`orchestrator-zero job ...` runs: a new TLS connection per request); a submitter thread
talks to one server, submitter i to server i % 3. Commands print their own start time
(`date +%s.%N`, run without a shell); this process, the agents and their commands share
the machine's one wall clock, so the times compare directly.

1. dispatch: D jobs `date +%s.%N`, one at a time, then D more from K submitters at once
   (each submits, waits for its job's end, submits the next): from the request being sent
   to the printed start time, read from GET /api/v1/jobs/<id>/output;
2. breakdown: for the jobs of (1), each series apart, the path from the rows (jobs,
   job_attempts) and the printed start: request → created (created_at) → attempt 1 placed
   (its started_at) → printed start → attempt 1 ended (its ended_at) → job ended
   (ended_at), and created → ended. A job with every attempt sent over its node's stream
   (issue 41: job_attempts.streamed) counts in `streamed`, one with an attempt on the old
   path (an old agent's: a Temporal activity) in `old_path`, never both. With each, the
   workflow's side from its history (a server's credentials, as operators may not read
   histories; a server's 7233), off the attempt's path since the server that claims a job
   places attempt 1 before it starts the workflow: created → and placed → the workflow
   started, its first workflow task's wait and run, and its server steps' schedule-to-start,
   run and (local steps' markers) how long into its workflow task the workflow's code asked
   for each (`temporal`, this phase's old name, still works with `--skip`);
2b. fanout: F jobs `--all -- date +%s.%N` one after another (`--fanouts`): from the
   request to each part's printed start, to the last part's, to the job's recorded end;
   every part that did not end `exit` named (with its node's agent log around it); the
   attempts given to their node again because Temporal lost the task on the way, counted
   from the histories (the node activity's events of the first three such jobs);
3. throughput: M jobs `true` from K submitters as fast as the API takes them, then until
   every one has ended: completed jobs per second from the rows' created_at / ended_at, and
   the CPU of each server, Temporal host, this cluster's PostgreSQL backends and the agents
   (from /proc) over the phase;
3b. paced: jobs `true` offered open-loop at R a second for S seconds (`--paced-rate`,
   `--paced-seconds`; 0 skips it; issue 41's goal: created → ended p50 < 1 s at 20 a
   second): each request sent at its due time by a free thread of a pool (more started
   while none is free, so a slow answer does not hold the next back), job i through server
   i % 3; how late each went out, the rate offered as sent, then until every one has ended
   (at most 120 s more): created → ended from the rows, the jobs that did not end
   `succeeded`, and the control plane's CPU-s a job over the phase (servers, Temporal hosts,
   PostgreSQL backends: the CPU measured as for (3));
4. block: B jobs `sh -c 'date +%s.%N; exec sleep 30'`; once attempt 1 has printed, its
   node is blocked; from the block request's answer to attempt 2's printed start time;
   then the job is cancelled and the node unblocked;
5. output: O jobs printing a time stamp every 0.2 s for 5 s, read by a poller every 0.1 s:
   from each printed time to the poll that first returned it.

Each figure is p50 / p90 / p99 / max in ms and its count. Every wait has a bound.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import json
import math
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client

from bench import runner
from bench.measure import CpuWindow, cpu_seconds, percentiles, rss_mib, utc_stamp
from bench.runner import Scenario, create_token, log, wait_until_servers
from cli.client import ApiClient, ApiError
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, ServerProcess
from fixtures.temporal import server_credentials
from oz0.context import MANAGEMENT_PORT, Context
from oz0.jobs.workflow import NODE_ACTIVITY
from oz0_common.addresses import EDGE_PORT

ADDRESSES = ("127.0.0.197", "127.0.0.198", "127.0.0.199")
EDGES = [f"{address}:{EDGE_PORT}" for address in ADDRESSES]
API_SERVERS = [f"{address}:{MANAGEMENT_PORT}" for address in ADDRESSES]
TEMPORAL = f"{ADDRESSES[0]}:7233"

# What issue 10 asks for.
DISPATCH_GOAL_P99 = 0.5
MOVE_GOAL_P99 = 2.0
# What issue 41 asks for: created → ended p50 at 20 jobs a second offered.
PACED_GOAL_P50 = 1.0
PACED_GOAL_RATE = 20.0

PRINT_START = ["date", "+%s.%N"]
SLEEPER = ["sh", "-c", "date +%s.%N; exec sleep 30"]
TICKER = ["sh", "-c", "for i in $(seq 25); do date +%s.%N; sleep 0.2; done"]
STAMP = ["date", "+%s.%N"]

# Bounds, so that a cluster that stops answering cannot keep the run going.
AGENTS_UP_TIMEOUT = 300.0
JOB_TIMEOUT = 60.0
THROUGHPUT_TIMEOUT = 300.0
PACED_DRAIN_TIMEOUT = 120.0  # from the last job offered at a rate
# The paced phase's pool has threads for this many seconds of answers outstanding.
PACED_SLOW_ANSWER = 10.0
MOVE_TIMEOUT = 30.0
RECONNECT_TIMEOUT = 60.0
GROUPS = {"server": "servers", "host": "temporal_hosts", "agent": "agents"}
CONTROL_PLANE = ("servers", "temporal_hosts", "postgres")
POLL_JOB = 0.2  # a waiting submitter's poll; the latencies come from printed times
POLL_MOVE = 0.05
POLL_OUTPUT = 0.1


class Failed(Exception):
    """A job or a request did not do what the benchmark needs."""


# --- the operator ------------------------------------------------------------------------


class Operator:
    """One ApiClient per thread, each on one server (by the thread's submitter number)."""

    def __init__(self, files: ClusterFiles) -> None:
        self.context = Context.load(files.context_path)
        self.local = threading.local()

    def client(self, server: int = 0) -> ApiClient:
        clients: dict[int, ApiClient] | None = getattr(self.local, "clients", None)
        if clients is None:
            clients = self.local.clients = {}
        if server not in clients:
            only = API_SERVERS[server % len(API_SERVERS)]
            clients[server] = ApiClient(dataclasses.replace(self.context, servers=(only,)))
        return clients[server]


def submit(client: ApiClient, command: list[str]) -> tuple[str, float, float]:
    """(the job's ID, when the request was sent, when it was answered), wall clock."""
    sent = time.time()
    job = client.post("/api/v1/jobs", {"tenant": "default", "command": command})
    return str(job["id"]), sent, time.time()


def chunks_of(page: dict[str, Any]) -> list[tuple[int, str, bytes]]:
    return [
        (int(c["attempt"]), str(c["stream"]), base64.b64decode(c["data"])) for c in page["chunks"]
    ]


def printed_times(data: bytes) -> list[float]:
    return [float(line) for line in data.split() if line]


def wait_ended(client: ApiClient, job_id: str, timeout: float) -> dict[str, Any]:
    """The job's output page (all its output) once it has ended."""
    deadline = time.monotonic() + timeout
    while True:
        page: dict[str, Any] = client.get(f"/api/v1/jobs/{job_id}/output")
        if page["ended"]:
            rest: dict[str, Any] = client.get(
                f"/api/v1/jobs/{job_id}/output", {"after": page["cursor"] or 0}
            )
            page["chunks"] += rest["chunks"]
            return page
        if time.monotonic() > deadline:
            raise Failed(f"job {job_id} did not end within {timeout} s: {page['job']['state']}")
        time.sleep(POLL_JOB)


@dataclass
class Dispatch:
    job_id: str
    sent: float
    answered: float
    printed: float
    node: str
    created_at: float


def dispatch_one(client: ApiClient) -> Dispatch:
    job_id, sent, answered = submit(client, PRINT_START)
    page = wait_ended(client, job_id, JOB_TIMEOUT)
    job = page["job"]
    out = b"".join(d for n, s, d in chunks_of(page) if s == "stdout" and n == 1)
    if job["state"] != "succeeded" or not out:
        attempts = [(a["node"], a["output_bytes"], a["ended_because"]) for a in job["attempts"]]
        raise Failed(
            f"job {job_id} ended {job['state']} ({job['reason']}), output {out!r},"
            f" attempts {attempts}"
        )
    return Dispatch(
        job_id,
        sent,
        answered,
        printed_times(out)[0],
        str(job["attempts"][0]["node"]),
        dt.datetime.fromisoformat(job["created_at"]).timestamp(),
    )


def dispatches(operator: Operator, count: int, submitters: int) -> list[Dispatch | str]:
    """COUNT jobs over SUBMITTERS threads, each job after the last one of its thread ended;
    a Dispatch per job, or the error that stopped it."""

    def one_thread(index: int, jobs: int) -> list[Dispatch | str]:
        client = operator.client(index)
        done: list[Dispatch | str] = []
        for _ in range(jobs):
            try:
                done.append(dispatch_one(client))
            except Exception as e:
                done.append(f"{type(e).__name__}: {e}"[:300])
        return done

    shares = [count // submitters + (i < count % submitters) for i in range(submitters)]
    with ThreadPoolExecutor(submitters) as pool:
        results = list(pool.map(one_thread, range(submitters), shares))
    return [d for r in results for d in r]


def dispatch_summary(results: list[Dispatch | str]) -> dict[str, Any]:
    ok = [d for d in results if isinstance(d, Dispatch)]
    latencies = [d.printed - d.sent for d in ok]
    return {
        "jobs": len(results),
        "measured": len(ok),
        "errors": dict(Counter(e.split(":")[0] for e in results if isinstance(e, str))),
        "first_errors": [e for e in results if isinstance(e, str)][:3],
        "request_to_started_ms": percentiles(latencies),
        "api_call_ms": percentiles([d.answered - d.sent for d in ok]),
        "answer_to_started_ms": percentiles([d.printed - d.answered for d in ok]),
        f"over_{DISPATCH_GOAL_P99 * 1000:g}ms": sum(t > DISPATCH_GOAL_P99 for t in latencies),
        "nodes_used": len({d.node for d in ok}),
    }


# --- jobs offered at a rate ----------------------------------------------------------------


@dataclass
class Offered:
    """One job of the paced phase: when its request was due, sent and answered (wall clock),
    and its ID or the error that answered it."""

    due: float
    sent: float
    answered: float
    job_id: str | None
    error: str | None = None


def offer(operator: Operator, rate: float, count: int) -> tuple[list[Offered], int]:
    """COUNT jobs `true` offered open-loop at RATE a second: each request handed at its due
    time to a free thread of a pool (one more started while none is free, up to RATE ×
    PACED_SLOW_ANSWER), job i through server i % 3; how late each went out is its sent −
    due. The jobs offered, and how many threads sent them."""
    offered: list[Offered] = []
    threads: set[int] = set()
    lock = threading.Lock()

    def send(index: int, due: float) -> None:
        client = operator.client(index % len(API_SERVERS))
        sent = time.time()
        try:
            job_id, sent, answered = submit(client, ["true"])
            done = Offered(due, sent, answered, job_id)
        except Exception as e:
            done = Offered(due, sent, time.time(), None, f"{type(e).__name__}: {e}"[:300])
        with lock:
            offered.append(done)
            threads.add(threading.get_ident())

    workers = max(16, math.ceil(rate * PACED_SLOW_ANSWER))
    began = time.time() + 0.5
    with ThreadPoolExecutor(workers, thread_name_prefix="paced") as pool:
        for i in range(count):
            due = began + i / rate
            time.sleep(max(0.0, due - time.time()))
            pool.submit(send, i, due)
    return sorted(offered, key=lambda o: o.due), len(threads)


def paced_summary(
    offered: list[Offered], rows: dict[str, Row], rate: float, seconds: float
) -> dict[str, Any]:
    ok = [o for o in offered if o.job_id is not None]
    failed = [o.error for o in offered if o.error is not None]
    sent = sorted(o.sent for o in offered)
    ended = [r for r in rows.values() if r.ended is not None]
    section: dict[str, Any] = {
        "rate": rate,
        "seconds": seconds,
        "jobs": len(offered),
        "offered_per_s": (
            round((len(sent) - 1) / (sent[-1] - sent[0]), 2) if len(sent) > 1 else None
        ),
        "send_late_ms": percentiles([o.sent - o.due for o in offered]),
        "api_call_ms": percentiles([o.answered - o.sent for o in ok]),
        "submitted": len(ok),
        "submit_errors": dict(Counter(e.split(":")[0] for e in failed)),
        "first_submit_errors": failed[:3],
        "ended": len(ended),
        "states": dict(Counter(r.state for r in rows.values())),
        "not_succeeded": len(ok) - sum(r.state == "succeeded" for r in rows.values()),
        **streamed_or_not(rows),
        "created_to_ended_ms": percentiles([r.ended - r.created for r in ended if r.ended]),
    }
    if len(ended) > 1:
        first = min(r.created for r in rows.values())
        last = max(r.ended for r in ended if r.ended is not None)
        section["completed_per_s"] = round(len(ended) / (last - first), 2)
    return section


# --- Temporal's view -----------------------------------------------------------------------


def event_time(event: HistoryEvent) -> float:
    return event.event_time.ToDatetime(dt.UTC).timestamp()


@dataclass
class History:
    """What one job workflow's history says, in wall-clock seconds."""

    workflow_started: float
    first_task_wait: float | None  # first workflow task: scheduled → started
    node_scheduled: float | None
    node_started: float | None
    first_task_run: float | None = None  # and started → completed (its local steps too)
    steps: dict[str, list[tuple[float, float | None]]] = field(default_factory=dict)
    # Each activity's run time: started → completed (or failed), by activity type.
    runs: dict[str, list[float]] = field(default_factory=dict)
    # Each local activity's (the database steps as JobInput.local_steps runs them), from its
    # marker, by activity type: from the start of the workflow task that recorded it to when
    # the workflow's code asked for it (the workflow's own time, before the step ran).
    local_asked: dict[str, list[float]] = field(default_factory=dict)


def parse_history(events: list[HistoryEvent]) -> History:
    started = event_time(events[0])
    scheduled: dict[int, tuple[str, float]] = {}
    began: dict[int, float] = {}
    first_task_wait = None
    task_scheduled: float | None = None
    task_started = started
    history = History(started, None, None, None)
    for event in events:
        if event.HasField("workflow_task_scheduled_event_attributes") and task_scheduled is None:
            task_scheduled = event_time(event)
        elif event.HasField("workflow_task_started_event_attributes") and first_task_wait is None:
            first_task_wait = event_time(event) - (task_scheduled or started)
            task_started = event_time(event)
        elif (
            event.HasField("workflow_task_completed_event_attributes")
            and history.first_task_run is None
        ):
            history.first_task_run = event_time(event) - task_started
        elif event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = (name, event_time(event))
            if name == NODE_ACTIVITY and history.node_scheduled is None:
                history.node_scheduled = event_time(event)
        elif event.HasField("activity_task_started_event_attributes"):
            attributes = event.activity_task_started_event_attributes
            name, at = scheduled[attributes.scheduled_event_id]
            history.steps.setdefault(name, []).append((at, event_time(event)))
            if name == NODE_ACTIVITY and history.node_started is None:
                history.node_started = event_time(event)
            began[attributes.scheduled_event_id] = event_time(event)
        elif event.HasField("activity_task_completed_event_attributes"):
            done = event.activity_task_completed_event_attributes.scheduled_event_id
            if done in began:
                name = scheduled[done][0]
                history.runs.setdefault(name, []).append(event_time(event) - began[done])
        elif event.HasField("marker_recorded_event_attributes"):
            local = local_activity_asked(event)
            if local is not None:
                history.local_asked.setdefault(local[0], []).append(local[1])
    history.first_task_wait = first_task_wait
    return history


def local_activity_asked(event: HistoryEvent) -> tuple[str, float] | None:
    """(activity type, seconds from the start of its workflow task to its scheduling) of a
    local activity's marker (the SDK core's LocalActivityMarkerData, JSON: its
    `complete_time` is the workflow's time, the start of the task that completed it; its
    `original_schedule_time` the wall clock's when the workflow's code asked for it); None
    for another marker."""
    attributes = event.marker_recorded_event_attributes
    payloads = attributes.details.get("data")
    if attributes.marker_name != "core_local_activity" or payloads is None:
        return None
    data = json.loads(payloads.payloads[0].data)
    asked, task_began = data.get("original_schedule_time"), data.get("complete_time")
    if not isinstance(asked, dict) or not isinstance(task_began, dict):
        return None

    def seconds(at: dict[str, Any]) -> float:
        return float(at.get("seconds", 0)) + float(at.get("nanos", 0)) / 1e9

    return str(data.get("activity_type")), seconds(asked) - seconds(task_began)


async def history_events(files: ClusterFiles, job_ids: list[str]) -> dict[str, list[HistoryEvent]]:
    """Each job's workflow history (a server's credentials: operators may not read them)."""
    client = await Client.connect(
        TEMPORAL, namespace="default", tls=server_credentials(files).tls()
    )
    found = {}
    for job_id in job_ids:
        history = await asyncio.wait_for(
            client.get_workflow_handle(job_id).fetch_history(), JOB_TIMEOUT
        )
        found[job_id] = list(history.events)
    return found


async def fetch_histories(files: ClusterFiles, job_ids: list[str]) -> dict[str, History]:
    events = await history_events(files, job_ids)
    return {job_id: parse_history(found) for job_id, found in events.items()}


def node_activity_events(histories: dict[str, list[HistoryEvent]]) -> dict[str, Any]:
    """Each job's node activity events (scheduled on which queue, started by which worker
    identity and when, how it ended), to tell a task a node never received from one it
    received and lost."""
    found: dict[str, Any] = {}
    for job_id, events in histories.items():
        rows: list[dict[str, Any]] = []
        for event in events:
            kind = event.WhichOneof("attributes") or ""
            if not kind.startswith("activity_task_"):
                continue
            attributes = getattr(event, kind)
            row: dict[str, Any] = {"id": event.event_id, "kind": kind, "at": event_time(event)}
            if kind == "activity_task_scheduled_event_attributes":
                if attributes.activity_type.name != NODE_ACTIVITY:
                    continue
                row |= {"activity": attributes.activity_id, "queue": attributes.task_queue.name}
            else:
                row["scheduled"] = attributes.scheduled_event_id
            for name in ("identity", "attempt", "request_id", "timeout_type"):
                if hasattr(attributes, name):
                    row[name] = str(getattr(attributes, name))
            if attributes.HasField("failure") if hasattr(attributes, "failure") else False:
                row["failure"] = attributes.failure.message[:200]
            if hasattr(attributes, "last_failure") and attributes.HasField("last_failure"):
                row["last_failure"] = attributes.last_failure.message[:200]
            rows.append(row)
        found[job_id] = rows
    return found


def given_again(events: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """From each job's node activity EVENTS: how many attempts were given to their node
    again (no node heard of them: oz0_common/attempt_heartbeat.py), and the events of the
    first three jobs that had one or a heartbeat timeout."""
    again: dict[str, int] = {}
    for job_id, rows in events.items():
        scheduled = [r["activity"] for r in rows if "activity" in r]
        again[job_id] = len(scheduled) - len(set(scheduled))
    odd = [
        job_id
        for job_id, rows in events.items()
        if again[job_id] or any(r["kind"].startswith("activity_task_timed_out") for r in rows)
    ]
    return {
        "attempts_given_again": sum(again.values()),
        "jobs_with_attempts_given_again": sum(1 for n in again.values() if n),
        "node_activity_events": {job_id: events[job_id] for job_id in odd[:3]},
    }


@dataclass
class Row:
    """What the database says of one job and of its first attempt, in wall-clock seconds."""

    created: float
    ended: float | None
    state: str
    # Every attempt of the job went over its node's stream (issue 41); False for a job with
    # an attempt on the old path (an old agent's: a Temporal activity); None with none.
    streamed: bool | None
    placed: float | None  # attempt 1's started_at: when it was placed
    attempt_ended: float | None  # attempt 1's ended_at


def read_rows(files: ClusterFiles, ids: list[str]) -> dict[str, Row]:
    """Each of IDS's job row and its first attempt's, by job ID (a job not found is not in)."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT j.id, extract(epoch FROM j.created_at)::float,"
            " extract(epoch FROM j.ended_at)::float, j.state,"
            " bool_and(a.streamed),"
            " extract(epoch FROM min(a.started_at) FILTER (WHERE a.number = 1))::float,"
            " extract(epoch FROM min(a.ended_at) FILTER (WHERE a.number = 1))::float"
            " FROM jobs j LEFT JOIN job_attempts a ON a.job_id = j.id"
            " WHERE j.id = ANY(%s) GROUP BY j.id",
            (ids,),
        ).fetchall()
    return {str(r[0]): Row(float(r[1]), r[2], str(r[3]), r[4], r[5], r[6]) for r in rows}


def streamed_or_not(rows: dict[str, Row]) -> dict[str, int]:
    return {
        "streamed": sum(r.streamed is True for r in rows.values()),
        "old_path": sum(r.streamed is False for r in rows.values()),
        "without_attempt": sum(r.streamed is None for r in rows.values()),
    }


def breakdown_summary(
    jobs: list[Dispatch], rows: dict[str, Row], histories: dict[str, History]
) -> dict[str, Any]:
    """The path of each dispatch, piece by piece, from its rows and its printed start, the
    jobs whose attempts went over the stream apart from those on the old path."""
    found = [(job, rows[job.job_id]) for job in jobs if job.job_id in rows]
    return {
        "jobs": len(jobs),
        "without_row": len(jobs) - len(found),
        "without_attempt": sum(r.streamed is None for _, r in found),
        "streamed": path_pieces([(j, r) for j, r in found if r.streamed is True], histories),
        "old_path": path_pieces([(j, r) for j, r in found if r.streamed is False], histories),
    }


def path_pieces(jobs: list[tuple[Dispatch, Row]], histories: dict[str, History]) -> dict[str, Any]:
    """For JOBS (all streamed, or all not): request → created → attempt 1 placed → its
    printed start → its end → the job's end; and from its workflow's history, the
    workflow's side: its start after created and after attempt 1 placed (the server that
    claims a job places its first attempt, then starts its workflow), its first workflow
    task, its server steps."""
    if not jobs:
        return {"jobs": 0}
    pieces: dict[str, list[float]] = {
        "request_to_created": [],
        "created_to_placed": [],
        "placed_to_printed": [],
        "printed_to_attempt_ended": [],
        "attempt_ended_to_job_ended": [],
        "created_to_ended": [],
        "created_to_workflow_started": [],
        "workflow_started_to_first_workflow_task": [],
        "first_workflow_task_run": [],
        "placed_to_workflow_started": [],
    }
    steps: dict[str, list[float]] = {}
    runs: dict[str, list[float]] = {}
    local_asked: dict[str, list[float]] = {}

    def add(name: str, begin: float | None, end: float | None) -> None:
        if begin is not None and end is not None:
            pieces[name].append(end - begin)

    for job, row in jobs:
        add("request_to_created", job.sent, row.created)
        add("created_to_placed", row.created, row.placed)
        add("placed_to_printed", row.placed, job.printed)
        add("printed_to_attempt_ended", job.printed, row.attempt_ended)
        add("attempt_ended_to_job_ended", row.attempt_ended, row.ended)
        add("created_to_ended", row.created, row.ended)
        h = histories.get(job.job_id)
        if h is None:
            continue
        add("created_to_workflow_started", row.created, h.workflow_started)
        if h.first_task_wait is not None:
            pieces["workflow_started_to_first_workflow_task"].append(h.first_task_wait)
        if h.first_task_run is not None:
            pieces["first_workflow_task_run"].append(h.first_task_run)
        add("placed_to_workflow_started", row.placed, h.workflow_started)
        for name, times in h.steps.items():
            if name != NODE_ACTIVITY:
                steps.setdefault(name, []).extend(b - a for a, b in times if b is not None)
        for name, took in h.runs.items():
            if name != NODE_ACTIVITY:
                runs.setdefault(name, []).extend(took)
        for name, took in h.local_asked.items():
            local_asked.setdefault(name, []).extend(took)
    return {
        "jobs": len(jobs),
        "histories": sum(job.job_id in histories for job, _ in jobs),
        **{f"{k}_ms": percentiles(v) for k, v in pieces.items()},
        "server_steps_schedule_to_start_ms": {k: percentiles(v) for k, v in steps.items()},
        "activity_run_ms": {k: percentiles(v) for k, v in runs.items()},
        "local_step_asked_after_task_start_ms": {k: percentiles(v) for k, v in local_asked.items()},
    }


# --- CPU and memory --------------------------------------------------------------------------


def backend_states(files: ClusterFiles) -> Counter[str]:
    """This cluster's PostgreSQL backends by database, state and wait event, now."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT datname, state, coalesce(wait_event_type || ':' || wait_event, '-')"
            " FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            (list(files.url.names.all()),),
        ).fetchall()
    return Counter(f"{r[0]} {r[1]} {r[2]}" for r in rows)


@contextlib.contextmanager
def sampling_backends(files: ClusterFiles, into: dict[str, Any]) -> Iterator[None]:
    """Every second while inside: the backends' states; INTO gets the mean and peak of each."""
    stop = threading.Event()
    samples: list[Counter[str]] = []

    def sample() -> None:
        while not stop.wait(1.0):
            with contextlib.suppress(psycopg.Error):
                samples.append(backend_states(files))

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
        keys = sorted({k for c in samples for k in c})
        into["samples"] = len(samples)
        into["mean_and_peak"] = {
            k: [round(sum(c[k] for c in samples) / len(samples), 1), max(c[k] for c in samples)]
            for k in keys
        }


def cluster_backends(files: ClusterFiles) -> list[int]:
    """The PostgreSQL backends of this cluster's databases (the servers' and the hosts')."""
    names = list(files.url.names.all())
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = ANY(%s) AND pid <> pg_backend_pid()",
            (names,),
        ).fetchall()
    return [int(r[0]) for r in rows]


@dataclass
class Jobs:
    args: argparse.Namespace
    files: ClusterFiles
    servers: dict[str, ServerProcess]
    agents: list[AgentProcess]
    out: dict[str, Any]
    phases: dict[str, Any] = field(default_factory=dict)
    window: CpuWindow | None = None
    began: float = 0.0

    def pids(self) -> dict[str, int | str]:
        found: dict[str, int | str] = {"bench": "self"}
        for address, server in self.servers.items():
            found[f"server {address}"] = server.pid
            for pid in server.started_children:
                found[f"host {address}"] = pid
        for i, agent in enumerate(self.agents):
            if agent.process is not None:
                found[f"agent {i}"] = agent.process.pid
        for pid in cluster_backends(self.files):
            found[f"postgres {pid}"] = pid
        return found

    def begin(self, name: str) -> None:
        log(f"{name} ...")
        self.began = time.monotonic()
        self.window = CpuWindow(self.pids()).start()

    def end(self, name: str, section: dict[str, Any], per_job: int | None = None) -> None:
        """Close phase NAME: SECTION with the phase's time and CPU (percent of one core);
        given PER_JOB, the jobs it ran, also `cpu_s_per_job`: the control plane's CPU-s
        (servers, Temporal hosts, PostgreSQL backends, and their sum) over the phase, a job."""
        assert self.window is not None
        wall = time.monotonic() - self.window.began
        cpu = self.window.stop()
        grouped: dict[str, float] = {}
        each: dict[str, float] = {}
        for key, value in cpu.items():
            if math.isnan(value):
                continue
            kind = key.split()[0]
            if kind in ("server", "host"):
                each[key] = value
            group = GROUPS.get(kind, kind)
            grouped[group] = grouped.get(group, 0.0) + value
        agent_cpu = [v for k, v in cpu.items() if k.startswith("agent ") and not math.isnan(v)]
        if per_job:
            spent = {g: grouped.get(g, 0.0) * wall / 100 / per_job for g in CONTROL_PLANE}
            section["cpu_s_per_job"] = {
                **{g: round(v, 4) for g, v in spent.items()},
                "control_plane": round(sum(spent.values()), 4),
            }
        self.phases[name] = {
            **section,
            "s": round(time.monotonic() - self.began, 1),
            "cpu_pct_of_one_core": {
                **{k: round(v, 1) for k, v in grouped.items()},
                "each": each,
                "busiest_agent": max(agent_cpu, default=None),
            },
        }
        log(f"{name}: {json.dumps(self.phases[name])}")

    # --- setup ---------------------------------------------------------------------------

    def start_agents(self, root: Path) -> None:
        token = create_token(self.files, "bench.jobs")
        base = root / "agents"
        base.mkdir()
        self.begin("agents_start")
        for i in range(self.args.nodes):
            edges = EDGES[i % 3 :] + EDGES[: i % 3]
            agent = AgentProcess.joining(base / f"node-{i}", edges, self.files.ca_hash, token=token)
            self.agents.append(agent.start())
        began = time.monotonic()
        deadline = began + AGENTS_UP_TIMEOUT
        while time.monotonic() < deadline:
            running = sum(a.reported().get("runtime") == "running" for a in self.agents)
            if running == len(self.agents):
                break
            time.sleep(1.0)
        reports = [a.reported() for a in self.agents]
        running = sum(r.get("runtime") == "running" for r in reports)
        # Started inside the window: their CPU since they started, start-up and join.
        spent = [cpu_seconds(a.process.pid) for a in self.agents if a.process is not None]
        self.end(
            "agents_start",
            {
                "agents": len(self.agents),
                "running": running,
                "up_s": round(time.monotonic() - began, 1),
                "agent_cpu_s": {
                    "mean": round(sum(spent) / len(spent), 2),
                    "total": round(sum(spent), 1),
                },
                "servers": dict(Counter(str(r.get("server")) for r in reports)),
            },
        )
        if running < len(self.agents):
            dead = [a for a in self.agents if not a.running()]
            tail = dead[0].log()[-1500:] if dead else self.agents[0].log()[-1500:]
            raise Failed(f"only {running} of {len(self.agents)} agents are running:\n{tail}")

    def idle(self) -> None:
        """The fleet idle: each kind of process's CPU, and the agents' memory."""
        self.begin("idle")
        time.sleep(self.args.idle)
        rss = [rss_mib(a.process.pid) for a in self.agents if a.process is not None]
        self.end(
            "idle",
            {
                "agent_rss_mib": {
                    "mean": round(sum(rss) / len(rss), 1),
                    "max": max(rss),
                    "total": round(sum(rss)),
                },
                "server_rss_mib": {a: rss_mib(s.pid) for a, s in self.servers.items()},
                "host_rss_mib": {
                    a: rss_mib(p) for a, s in self.servers.items() for p in s.started_children
                },
            },
        )

    # --- the phases ----------------------------------------------------------------------

    def dispatch(self, operator: Operator) -> list[Dispatch]:
        measured: list[Dispatch] = []
        for name, submitters in (
            ("dispatch_sequential", 1),
            ("dispatch_concurrent", self.args.submitters),
        ):
            self.begin(name)
            results = dispatches(operator, self.args.dispatch, submitters)
            self.end(name, {"submitters": submitters, **dispatch_summary(results)})
            measured += [d for d in results if isinstance(d, Dispatch)]
        return measured

    def breakdown(self, measured: list[Dispatch]) -> None:
        self.begin("breakdown")
        sequential = measured[: self.args.dispatch]
        ids = [d.job_id for d in measured]
        rows = read_rows(self.files, ids)
        histories = asyncio.run(fetch_histories(self.files, ids))
        self.end(
            "breakdown",
            {
                "sequential": breakdown_summary(sequential, rows, histories),
                "concurrent": breakdown_summary(measured[len(sequential) :], rows, histories),
            },
        )

    def throughput(self, operator: Operator) -> None:
        count, submitters = self.args.throughput, self.args.submitters
        self.begin("throughput")
        ids: list[str] = []
        errors: Counter[str] = Counter()
        lock = threading.Lock()

        def one_thread(index: int, jobs: int) -> None:
            client = operator.client(index)
            for _ in range(jobs):
                try:
                    job_id, _, _ = submit(client, ["true"])
                except Exception as e:
                    with lock:
                        errors[type(e).__name__] += 1
                    continue
                with lock:
                    ids.append(job_id)

        began = time.monotonic()
        shares = [count // submitters + (i < count % submitters) for i in range(submitters)]
        backends: dict[str, Any] = {}
        with sampling_backends(self.files, backends):
            with ThreadPoolExecutor(submitters) as pool:
                list(pool.map(one_thread, range(submitters), shares))
            submitted_s = time.monotonic() - began
            rows = rows_once_ended(self.files, ids, began + THROUGHPUT_TIMEOUT)
        ended = sorted(e for _, _, e in rows if e is not None)
        created = sorted(c for _, c, _ in rows)
        states = Counter(s for s in job_states(self.files, ids))
        section: dict[str, Any] = {
            "jobs": count,
            "submitters": submitters,
            "submitted": len(ids),
            "submit_errors": dict(errors),
            "submitted_per_s": round(len(ids) / submitted_s, 1),
            "ended": len(ended),
            "states": dict(states),
            "postgres_backends": backends,
        }
        if len(ended) >= 10:
            first, last = created[0], ended[-1]
            # The middle 80 % of completions: neither the ramp nor the tail.
            low, high = ended[len(ended) // 10], ended[len(ended) * 9 // 10]
            section |= {
                "first_created_to_last_ended_s": round(last - first, 2),
                "completed_per_s": round(len(ended) / (last - first), 1),
                "completed_per_s_middle_80pct": round(
                    (len(ended) * 9 // 10 - len(ended) // 10) / (high - low), 1
                ),
                "created_to_ended_ms": percentiles([e - c for _, c, e in rows if e is not None]),
            }
        self.end("throughput", section)

    def paced(self, operator: Operator) -> None:
        """Jobs `true` offered at --paced-rate a second for --paced-seconds (issue 41: created
        → ended p50 < 1 s at 20 a second), then until every one has ended."""
        rate, seconds = self.args.paced_rate, self.args.paced_seconds
        self.begin("paced")
        offered, threads = offer(operator, rate, round(rate * seconds))
        ids = [o.job_id for o in offered if o.job_id is not None]
        rows_once_ended(self.files, ids, time.monotonic() + PACED_DRAIN_TIMEOUT)
        rows = read_rows(self.files, ids)
        section = paced_summary(offered, rows, rate, seconds)
        self.end("paced", {**section, "submitter_threads": threads}, per_job=len(ids))

    def block(self, operator: Operator) -> None:
        client = operator.client(0)
        self.begin("block")
        moves: list[dict[str, Any]] = []
        for _ in range(self.args.blocks):
            try:
                moves.append(self.move_one(client))
            except Exception as e:
                moves.append({"error": f"{type(e).__name__}: {e}"[:300]})
        ok = [m for m in moves if "error" not in m]
        answer_to = [m["answer_to_started"] for m in ok]
        self.end(
            "block",
            {
                "jobs": len(moves),
                "measured": len(ok),
                "errors": [m["error"] for m in moves if "error" in m][:5],
                "block_answer_to_attempt_2_started_ms": percentiles(answer_to),
                "block_request_to_attempt_2_started_ms": percentiles(
                    [m["request_to_started"] for m in ok]
                ),
                "block_api_call_ms": percentiles([m["api_call"] for m in ok]),
                f"over_{MOVE_GOAL_P99:g}s": sum(t > MOVE_GOAL_P99 for t in answer_to),
                "attempt_1_ended_because": dict(Counter(m["because"] for m in ok)),
                "attempt_2_on_another_node": sum(m["other_node"] for m in ok),
                "agents_connected_at_end": self.wait_reconnected(),
            },
        )

    def move_one(self, client: ApiClient) -> dict[str, Any]:
        job_id, _, _ = submit(client, SLEEPER)
        path = f"/api/v1/jobs/{job_id}/output"
        first = wait_printed(client, path, 1, JOB_TIMEOUT)
        job = client.get(f"/api/v1/jobs/{job_id}")
        node = str(job["attempts"][0]["node"])
        requested = time.time()
        client.post(f"/api/v1/nodes/{node}/block", {"reason": "bench.jobs"})
        answered = time.time()
        try:
            second = wait_printed(client, path, 2, MOVE_TIMEOUT, POLL_MOVE)
        finally:
            with contextlib.suppress(Exception):
                client.post(f"/api/v1/jobs/{job_id}/cancel", {})
            client.post(f"/api/v1/nodes/{node}/unblock", {})
        job = client.get(f"/api/v1/jobs/{job_id}")
        del first
        return {
            "job": job_id,
            "answer_to_started": second - answered,
            "request_to_started": second - requested,
            "api_call": answered - requested,
            "because": job["attempts"][0]["ended_because"],
            "other_node": job["attempts"][1]["node"] != node,
        }

    def wait_reconnected(self) -> int:
        deadline = time.monotonic() + RECONNECT_TIMEOUT
        while True:
            running = sum(int(a.reported().get("runtime") == "running") for a in self.agents)
            if running == len(self.agents) or time.monotonic() > deadline:
                return running
            time.sleep(0.5)

    def fanout(self, operator: Operator) -> None:
        """F jobs `--all -- date +%s.%N`, one after another (issue 31: on 100 nodes every
        part started p99 < 1 s and the whole job ended < 2 s after the request): each part's
        printed start and the job's recorded end, from the request; parts that did not end
        `exit` (lost, moved) are counted and named."""
        client = operator.client(0)
        self.begin("fanout")
        part_started: list[float] = []
        last_started: list[float] = []
        job_ended: list[float] = []
        not_exit: list[str] = []
        errors: list[str] = []
        states: Counter[str] = Counter()
        windows: dict[str, float] = {}
        ids: list[str] = []
        for _ in range(self.args.fanouts):
            sent = time.time()
            try:
                job = client.post(
                    "/api/v1/jobs", {"tenant": "default", "command": STAMP, "all": True}
                )
                page = wait_ended(client, str(job["id"]), JOB_TIMEOUT)
            except (Failed, ApiError, OSError) as e:
                errors.append(f"{type(e).__name__}: {e}"[:300])
                continue
            ended = page["job"]
            ids.append(str(ended["id"]))
            states[str(ended["state"])] += 1
            starts = [
                printed_times(data)[0] - sent
                for _, stream, data in chunks_of(page)
                if stream == "stdout" and data.strip()
            ]
            part_started += starts
            last_started.append(max(starts, default=math.nan))
            [(_, _, ended_at)] = job_rows(self.files, [str(ended["id"])])
            if ended_at is not None:
                job_ended.append(ended_at - sent)
            lost = [a for a in ended["attempts"] if a.get("ended_because") != "exit"]
            not_exit += [
                f"{ended['id']} attempt {a['number']} on {a['node']}: {a['ended_because']}"
                for a in lost
            ]
            windows |= {str(a["node"]): sent for a in lost}
        self.end(
            "fanout",
            {
                "jobs": self.args.fanouts,
                "nodes": len(self.agents),
                "states": dict(states),
                "errors": errors,
                "request_to_part_started_ms": percentiles(part_started),
                "request_to_last_part_started_ms": percentiles(
                    [t for t in last_started if not math.isnan(t)]
                ),
                "request_to_job_ended_ms": percentiles(job_ended),
                "parts_not_ended_exit": not_exit,
                "lost_nodes_logs": self.logs_around(windows),
                **given_again(node_activity_events(asyncio.run(history_events(self.files, ids)))),
            },
        )

    def logs_around(self, windows: dict[str, float]) -> dict[str, list[str]]:
        """Each node's agent log from 1 s before to 25 s after the request of the job
        (WINDOWS: node ID → request time) it lost a part of (the first five nodes)."""
        found: dict[str, list[str]] = {}
        for node_id, sent in sorted(windows.items())[:5]:
            begin = dt.datetime.fromtimestamp(sent - 1).strftime("%Y-%m-%d %H:%M:%S")
            end = dt.datetime.fromtimestamp(sent + 25).strftime("%Y-%m-%d %H:%M:%S")
            for agent in self.agents:
                text = agent.log()
                if node_id in text:
                    found[node_id] = [
                        line[:400]
                        for line in text.splitlines()
                        if begin <= line[:19].replace("T", " ") <= end or "runtime" in line
                    ]
                    break
        return found

    def output(self, operator: Operator) -> None:
        client = operator.client(0)
        self.begin("output")
        latencies: list[float] = []
        errors = []
        for _ in range(self.args.output_jobs):
            try:
                latencies += follow_output(client)
            except Exception as e:
                errors.append(f"{type(e).__name__}: {e}"[:300])
        self.end(
            "output",
            {
                "jobs": self.args.output_jobs,
                "lines": len(latencies),
                "errors": errors,
                "printed_to_seen_ms": percentiles(latencies),
            },
        )


def wait_printed(
    client: ApiClient, path: str, attempt: int, timeout: float, poll: float = POLL_JOB
) -> float:
    """The first time stamp ATTEMPT of the job printed."""
    deadline = time.monotonic() + timeout
    while True:
        page = client.get(path, {"attempt": attempt})
        data = b"".join(d for _, s, d in chunks_of(page) if s == "stdout")
        if data.strip():
            return printed_times(data)[0]
        if page["ended"]:
            raise Failed(f"{path}: ended without attempt {attempt}: {page['job']['reason']}")
        if time.monotonic() > deadline:
            raise Failed(f"{path}: attempt {attempt} printed nothing within {timeout} s")
        time.sleep(poll)


def follow_output(client: ApiClient) -> list[float]:
    """Run TICKER and poll its output every POLL_OUTPUT: each line's printed → seen."""
    job_id, _, _ = submit(client, TICKER)
    path = f"/api/v1/jobs/{job_id}/output"
    cursor, pending, seen = 0, b"", []
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        page = client.get(path, {"after": cursor})
        at = time.time()
        for _, stream, data in chunks_of(page):
            if stream != "stdout":
                continue
            *lines, pending = (pending + data).split(b"\n")
            seen += [at - float(line) for line in lines if line]
        cursor = page["cursor"] or cursor
        if page["ended"] and not page["chunks"]:
            if len(seen) < 25:
                raise Failed(f"job {job_id}: {len(seen)} of 25 lines ({page['job']['state']})")
            return seen
        time.sleep(POLL_OUTPUT)
    raise Failed(f"job {job_id} did not end within {JOB_TIMEOUT} s")


def job_rows(files: ClusterFiles, ids: list[str]) -> list[tuple[str, float, float | None]]:
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, extract(epoch FROM created_at)::float,"
            " extract(epoch FROM ended_at)::float FROM jobs WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    return [(str(r[0]), float(r[1]), None if r[2] is None else float(r[2])) for r in rows]


def rows_once_ended(
    files: ClusterFiles, ids: list[str], deadline: float
) -> list[tuple[str, float, float | None]]:
    """IDS's job_rows once every one has ended, or as they are at DEADLINE (monotonic)."""
    while True:
        rows = job_rows(files, ids)
        if all(r[2] is not None for r in rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.5)


def job_states(files: ClusterFiles, ids: list[str]) -> Iterator[str]:
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute("SELECT state FROM jobs WHERE id = ANY(%s)", (ids,)).fetchall()
    return (str(r[0]) for r in rows)


def measure(bench: Jobs, root: Path) -> None:
    if not trio.run(wait_until_servers, bench.files, len(bench.servers)):
        raise Failed(f"not all {len(bench.servers)} servers were up")
    time.sleep(2.5)  # one more round of every edge's directory
    bench.out["phases_utc"] = [utc_stamp(), None]
    bench.start_agents(root)
    bench.idle()
    operator = Operator(bench.files)
    steps: list[tuple[str, Callable[[], object]]] = []
    measured: list[Dispatch] = []

    def dispatch() -> None:
        measured.extend(bench.dispatch(operator))

    steps += [("dispatch", dispatch), ("breakdown", lambda: bench.breakdown(measured))]
    steps += [("fanout", lambda: bench.fanout(operator))]
    steps += [("throughput", lambda: bench.throughput(operator))]
    steps += [("paced", lambda: bench.paced(operator))]
    steps += [("block", lambda: bench.block(operator)), ("output", lambda: bench.output(operator))]
    skip = set(bench.args.skip)
    if "temporal" in skip:  # the breakdown's name before parts were rows
        skip.add("breakdown")
    if bench.args.paced_seconds <= 0:
        skip.add("paced")
    for name, step in steps:
        if name in skip:
            continue
        step()
    bench.out["phases_utc"][1] = utc_stamp()
    bench.out["goals"] = goals(bench.phases)
    bench.out["agent_lines_about_failed_jobs"] = agent_lines(bench)


def agent_lines(bench: Jobs) -> dict[str, list[str]]:
    """What the agents logged about each job a phase reported as failed."""
    text = json.dumps(bench.phases)
    found: dict[str, list[str]] = {}
    for job_id in sorted(set(re.findall(r"job-[0-9a-f]{12}", text)))[:10]:
        for agent in bench.agents:
            found.setdefault(job_id, []).extend(
                line[:300] for line in agent.log().splitlines() if job_id in line
            )
    return found


def goals(phases: dict[str, Any]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name in ("dispatch_sequential", "dispatch_concurrent"):
        if name in phases:
            p99 = phases[name]["request_to_started_ms"]["p99"]
            found[f"{name}_p99_ms"] = p99
            found[f"{name}_under_500ms"] = p99 is not None and p99 < DISPATCH_GOAL_P99 * 1000
    if "paced" in phases:
        p50 = phases["paced"]["created_to_ended_ms"]["p50"]
        offered = phases["paced"]["offered_per_s"]
        found["paced_offered_per_s"] = offered
        found["paced_created_to_ended_p50_ms"] = p50
        # Issue 41's goal is at 20 a second offered: less offered does not meet it.
        found["paced_under_1s_at_20_per_s"] = (
            p50 is not None
            and p50 < PACED_GOAL_P50 * 1000
            and offered is not None
            and offered >= PACED_GOAL_RATE * 0.95
            and phases["paced"]["not_succeeded"] == 0
        )
    if "block" in phases:
        p99 = phases["block"]["block_answer_to_attempt_2_started_ms"]["p99"]
        found["block_p99_ms"] = p99
        found["block_under_2s"] = p99 is not None and p99 < MOVE_GOAL_P99 * 1000
    return found


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=100, help="real agents")
    parser.add_argument("--dispatch", type=int, default=100, help="jobs per dispatch series")
    parser.add_argument("--submitters", type=int, default=10, help="concurrent submitters")
    parser.add_argument("--throughput", type=int, default=500, help="jobs of the throughput")
    parser.add_argument("--blocks", type=int, default=20, help="jobs moved by a block")
    parser.add_argument("--output-jobs", type=int, default=3, help="jobs whose output is timed")
    parser.add_argument("--fanouts", type=int, default=20, help="`--all` jobs, one at a time")
    parser.add_argument("--idle", type=float, default=10.0, help="idle seconds measured")
    parser.add_argument(
        "--paced-rate", type=float, default=PACED_GOAL_RATE, help="jobs a second offered (paced)"
    )
    parser.add_argument(
        "--paced-seconds", type=float, default=30.0, help="seconds offered (paced; 0 skips it)"
    )
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["dispatch", "breakdown", "temporal", "fanout",
                                                  "throughput", "paced", "block", "output"],
        help="phases not run (`temporal`: the breakdown's old name)",
    )  # fmt: skip


def check(args: argparse.Namespace) -> str | None:
    if args.nodes < 2 or args.submitters < 1 or args.dispatch < 1:
        return "need --nodes >= 2 (a block moves the job), --submitters and --dispatch >= 1"
    if args.paced_seconds > 0 and args.paced_rate <= 0:
        return "need --paced-rate > 0 (or --paced-seconds 0)"
    return None


def run(bench: runner.Bench) -> None:
    jobs = Jobs(bench.args, bench.files, bench.servers, [], bench.out)
    bench.out["phases"] = jobs.phases
    try:
        measure(jobs, bench.root)
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda a: a.stop(), jobs.agents))


SCENARIO = Scenario(
    "jobs",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda _: ADDRESSES,
    check=check,
    measured=("oz0", "cli", "oz0_node"),
)
