"""Commands that outlive their servers and their agent (issue 30, "Measure").

    python -m bench.outlive [--nodes N] [--commands C] [--duration D] [--lull L]
                            [--restart-commands R] [--restart-duration S] [--kill-host]
                            [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and three real servers on
127.0.0.244, .245 and .246 (default ports); then N real agents
(`python -m oz0_node.main start`, fixtures/agent.py) joined with one unlimited token
(accepted at once), agent i given edge i % 3 first. Requests go through the management API
of .246 (the server that stays up) with the cluster context's operator.

1. running: C jobs, job i on node i (`--node`), each printing D numbered lines, one a
   second, each line exactly LINE bytes with the line's number, the command's PID and the
   time (a shell loop: its PID stays the same only if it is never started again); until
   every job's attempt 1 has printed.
2. kill: SIGKILL of server .244 (with `--kill-host`, its Temporal host too, as a machine
   that dies; without, the host sees its server gone and stops on its own). Then, polled
   every 250 ms at most until each attempt is heartbeated again or RECOVERY_BOUND passes,
   each attempt's heartbeats as recorded where the cluster decides whether its job is
   lost; where, `job_attempts.streamed` says per attempt (each group of figures counts
   how many came from each, `paths`):
   - a streamed part (issue 41: a row sent over its node's control stream, no Temporal
     activity): its node's row, as the servers' sweepers read it (oz0/jobs/parts.py
     `silent_parts`): `nodes.last_seen`, which the edges write for every node they heard
     from once a node heartbeat interval (5 s) and at once when a stream comes up, counted
     only while the row's `server` is up and is not the server the fault took (a killed
     one's row still looks up for a few seconds, a drained one writes its last round on
     its way out). The first such write after the fault, minus the fault: the node heard
     again. A node the fault spared that was heard at its edge's usual cadence throughout
     has nothing to resume (its first write after the fault says only when its edge's
     round came): counted as `heard_throughout`, not as a figure.
   - an activity (an agent that does not take attempts by stream): Temporal's own record
     of the attempt's activity (`attempt-1`), its pending activity's `last_heartbeat_time`
     (DescribeWorkflowExecution with a server's credentials, on .246): the first
     heartbeat after the kill, as Temporal stamped it, minus the kill; a node's
     reconnection alone says nothing of the edge's calls to Temporal, nor of Temporal's
     shards that the dead host held.
   Either way, a write or heartbeat that ends a silence longer than the path's normal
   cadence counts instead of the first (one already under way at the fault may land just
   after it). That is what the issue asks (the attempts' heartbeats resume, wherever the
   node reconnected). It is reported for the nodes that streamed to the killed server and
   for the others; with each node's reconnection (its status.json, polled every 50 ms)
   beside it.
3. drain: LULL seconds after the kill, SIGTERM of server .245 (a graceful stop: its nodes
   are told to move at once); the same figures, and how long the server took to exit.
4. finish: every job's end, then for each (through the API): its state, its attempts
   (any but one attempt ending `exit` 0 is a command killed), its stdout checked line by
   line: lines missing (their bytes are the output lost), duplicated, out of order, or
   not whole; more than one PID, or line 1 twice, is a command started again.
5. agent restart: one more agent, with `--max-jobs R`, on .246, running R jobs of S lines;
   once all have printed, `kill -9` of the agent and a new one started at once on the same
   data directory; once their heartbeats resumed, SIGTERM of that one and another
   started; the same figures as 2 and 4 for each restart.

Times are p50 / p90 / p99 / max in ms and their count. Every wait has a bound. The
faults land only on commands still running then: each phase says how many were.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import trio
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.service import RPCError

from bench import runner
from bench.measure import percentiles, utc_stamp
from bench.runner import Scenario, create_token, log, wait_until_servers
from cli.client import ApiClient
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles, ServerProcess
from fixtures.temporal import server_credentials
from fixtures.zygotes import ProcessHandle
from oz0.context import MANAGEMENT_PORT, Context
from oz0.membership import UP_WINDOW
from oz0.nodes import HEARTBEAT
from oz0.server.edge.attempts import BEAT_MAX
from oz0_common.addresses import EDGE_PORT
from oz0_node.jobs.manager import ALIVE_EVERY

ADDRESSES = ("127.0.0.244", "127.0.0.245", "127.0.0.246")
EDGES = [f"{address}:{EDGE_PORT}" for address in ADDRESSES]
KILLED, DRAINED, SURVIVOR = ADDRESSES
API = f"{SURVIVOR}:{MANAGEMENT_PORT}"
TEMPORAL = f"{SURVIVOR}:7233"
NAMESPACE = "default"  # the tenant's namespace: every job here is tenant default's

# One line of a command's output: number, PID, time (`date +%s.%N`: 20 characters until
# 2286), padding; exactly LINE bytes with its newline.
LINE = 100
PAD = "x" * (LINE - len("00001 0000000001 1700000000.000000000 \n"))

# The goals.
RESUME_GOAL = 5.0

# Bounds, so that a cluster that stops answering cannot keep the run going.
AGENTS_UP_TIMEOUT = 300.0
PRINTED_TIMEOUT = 120.0
RECOVERY_BOUND = 60.0
AGENT_EXIT_TIMEOUT = 15.0
END_MARGIN = 120.0  # past a command's own length, for its job to end
HEARTBEAT_POLL = 0.25
# A node reports its attempts every second (oz0_node/jobs/manager.py ALIVE_EVERY) and its
# edge heartbeats each at most every BEAT_MAX (oz0/server/edge/attempts.py): a longer
# silence than this is the fault's. An attempt is watched until it has a heartbeat SETTLE
# after the fault, so that a silence after one already under way at the fault is seen.
NORMAL_GAP = BEAT_MAX + ALIVE_EVERY + 0.5
SETTLE = NORMAL_GAP + 1.0
# A streamed part has no activity: its node is heard from in its row, whose `last_seen`
# each edge writes for every node heard from once a node heartbeat interval
# (oz0/server/edge/tracking.py, nodes.HEARTBEAT), and at once when a stream comes up
# (nodes.control_connect). The same rules with that cadence.
STREAMED_GAP = HEARTBEAT + 1.0
STREAMED_SETTLE = STREAMED_GAP + 1.0
STATUS_POLL = 0.05
SLOW_RECONNECT = 1.0
DESCRIBES_AT_ONCE = 16
CALL_TIMEOUT = 5.0


class Failed(Exception):
    """The cluster did not do what the benchmark needs to go on."""


def command(lines: int) -> list[str]:
    """LINES numbered lines, one a second; fixed text, no shell input from anywhere."""
    script = (
        f"for i in $(seq {lines}); do"
        f' printf "%05d %10d %s {PAD}\\n" "$i" "$$" "$(date +%s.%N)"; sleep 1; done'
    )
    return ["sh", "-c", script]


# --- the API -------------------------------------------------------------------------------


def survivor_api(files: ClusterFiles) -> ApiClient:
    """An operator's client on the server that stays up (a new TLS connection a request)."""
    context = Context.load(files.context_path)
    return ApiClient(dataclasses.replace(context, servers=(API,)))


def submit(files: ClusterFiles, nodes: list[str], lines: int) -> list[str]:
    """A job on each of NODES printing LINES lines; their IDs, in the order of NODES."""

    def one(node: str) -> str:
        job = survivor_api(files).post(
            "/api/v1/jobs", {"tenant": "default", "command": command(lines), "node": node}
        )
        return str(job["id"])

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, nodes))


def stdout_of(client: ApiClient, job_id: str) -> tuple[dict[str, Any], dict[int, bytes], int]:
    """The job, each attempt's stdout, and the bytes of stderr, paged to the end."""
    out: dict[int, bytes] = {}
    stderr = 0
    after = 0
    while True:
        page = client.get(f"/api/v1/jobs/{job_id}/output", {"after": after})
        for chunk in page["chunks"]:
            data = base64.b64decode(chunk["data"])
            if chunk["stream"] == "stdout":
                out[int(chunk["attempt"])] = out.get(int(chunk["attempt"]), b"") + data
            else:
                stderr += len(data)
        after = page["cursor"] or after
        if not page["more"]:
            return page["job"], out, stderr


# --- the database --------------------------------------------------------------------------


def printed(files: ClusterFiles, job_ids: list[str]) -> dict[str, float]:
    """Of JOB_IDS, those whose attempt 1 has stored output: when it was first stored."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT job_id, extract(epoch FROM min(at))::float FROM job_output"
            " WHERE job_id = ANY(%s) AND attempt = 1 GROUP BY job_id",
            (job_ids,),
        ).fetchall()
    return {str(r[0]): float(r[1]) for r in rows}


def ended(files: ClusterFiles, job_ids: list[str]) -> int:
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM jobs WHERE id = ANY(%s) AND ended_at IS NOT NULL", (job_ids,)
        ).fetchone()
    return int(row[0]) if row else 0


def server_ids(files: ClusterFiles) -> dict[str, str]:
    """Each server's ID (what an agent's status names), by its address."""
    with psycopg.connect(files.main_db, autocommit=True) as conn:
        rows = conn.execute("SELECT advertise, id FROM servers").fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


# --- each attempt's heartbeats: Temporal's record, or its node's row ------------------------


async def last_heartbeat(client: Client, job_id: str, activity_id: str) -> float | str:
    """When Temporal last recorded a heartbeat of the job's activity ACTIVITY_ID (wall
    clock); "none" before its first, "gone" once it is no longer pending (it ended, timed
    out or the workflow moved on), "error" if Temporal did not answer."""
    request = DescribeWorkflowExecutionRequest(
        namespace=NAMESPACE, execution=WorkflowExecution(workflow_id=job_id)
    )
    try:
        answer = await client.workflow_service.describe_workflow_execution(
            request, timeout=dt.timedelta(seconds=CALL_TIMEOUT)
        )
    except (RPCError, TimeoutError):
        return "error"
    for pending in answer.pending_activities:
        if pending.activity_id == activity_id:
            if not pending.HasField("last_heartbeat_time"):
                return "none"
            return pending.last_heartbeat_time.ToDatetime(dt.UTC).timestamp()
    return "gone"


# Each attempt 1 of the jobs: whether it is a streamed part (a row sent over its node's
# stream, issue 41) or a Temporal activity (an agent that does not take attempts by stream).
ATTEMPT_PATHS = "SELECT job_id, streamed FROM job_attempts WHERE job_id = ANY(%s) AND number = 1"
# A streamed attempt's node as the servers' sweepers see it (oz0/jobs/parts.py
# `silent_parts`): its row's `last_seen`, counted only while the row's `server` is up
# (nodes.CONNECTED's test) and is not one of the EXCLUDED (the server the fault took: a
# killed one's row still looks up for UP_WINDOW, a drained one writes its round of its
# nodes on its way out).
NODES_HEARD = (
    "SELECT a.job_id, a.state = 'running', extract(epoch FROM n.last_seen)::float,"
    " n.server IS NOT NULL AND n.server <> ALL(%(excluded)s::text[]) AND EXISTS ("
    "  SELECT 1 FROM servers s WHERE s.id = n.server AND s.last_heartbeat > now() - %(up)s)"
    " FROM job_attempts a JOIN nodes n ON n.id = a.node_id"
    " WHERE a.job_id = ANY(%(jobs)s) AND a.number = 1"
)


@dataclass
class Rows:
    """The database, as the streamed attempts' heartbeats are read from it (one connection,
    opened again after a failure)."""

    url: str
    conn: psycopg.AsyncConnection[Any] | None = None

    async def query(self, sql: str, params: Any) -> list[tuple[Any, ...]] | None:
        """The rows; None if the database did not answer within CALL_TIMEOUT."""
        try:
            async with asyncio.timeout(CALL_TIMEOUT):
                if self.conn is None or self.conn.closed:
                    self.conn = await psycopg.AsyncConnection.connect(self.url, autocommit=True)
                cursor = await self.conn.execute(sql, params)
                return await cursor.fetchall()
        except (psycopg.Error, TimeoutError):
            await self.close()
            return None

    async def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                await self.conn.close()
            self.conn = None

    async def paths(self, job_ids: list[str]) -> set[str]:
        """Those of JOB_IDS whose attempt 1 is a streamed part."""
        rows = await self.query(ATTEMPT_PATHS, (job_ids,))
        if rows is None:
            raise Failed("the database did not say which attempts are streamed")
        missing = sorted(set(job_ids) - {str(r[0]) for r in rows})
        if missing:
            raise Failed(f"{len(missing)} jobs have no attempt 1: {missing[:5]}")
        return {str(r[0]) for r in rows if r[1]}

    async def heard(self, job_ids: list[str], excluded: list[str]) -> dict[str, float | str]:
        """For each of JOB_IDS (streamed), when a server last heard its node (wall clock, as
        the database stamped it), as `last_heartbeat` answers for an activity: "none" while
        its row names no server that is up and not EXCLUDED, "gone" once the part no longer
        runs (it ended, or was moved), "error" if the database did not answer."""
        rows = await self.query(
            NODES_HEARD, {"jobs": job_ids, "excluded": excluded, "up": UP_WINDOW}
        )
        if rows is None:
            return dict.fromkeys(job_ids, "error")
        found: dict[str, float | str] = dict.fromkeys(job_ids, "gone")
        for job_id, running, last_seen, counted in rows:
            if not running:
                continue
            found[str(job_id)] = float(last_seen) if counted and last_seen is not None else "none"
        return found


@dataclass
class Watched:
    """One agent watched through a fault: its attempts, and how it counts as back."""

    name: str
    agent: AgentProcess
    jobs: list[str]
    # Whether its control stream was on the server that the fault hit (or, for an agent's
    # own restart, always).
    hit: bool
    back: Callable[[dict[str, Any]], bool]


@dataclass(frozen=True)
class Resumed:
    """One attempt through a fault (Recovery.resumed)."""

    after_s: float | None  # from the fault to its heartbeats resumed; None if they did not
    longest_silence_s: float | None
    # A streamed attempt on a node the fault spared that was never silent longer than its
    # edge's usual cadence: there was nothing to resume (the first write after the fault
    # says only when that edge's round came, 0-5 s later).
    heard_throughout: bool = False


@dataclass
class Recovery:
    """What one fault did to the heartbeats and streams of the watched agents."""

    at: float = 0.0  # the fault, wall clock
    beats: dict[str, list[float]] = field(default_factory=dict)  # job → heartbeats seen
    gone: list[str] = field(default_factory=list)  # no longer pending (activity) or running
    # Jobs whose attempt is a streamed part (heard in its node's row), and the hit nodes'.
    streamed: set[str] = field(default_factory=set)
    hit: set[str] = field(default_factory=set)
    reconnect_s: dict[str, float] = field(default_factory=dict)  # agent → back - fault
    exited_s: float | None = None  # the process the fault ended: its exit - fault
    # What an agent slower than SLOW_RECONNECT to come back logged meanwhile.
    slow: dict[str, list[str]] = field(default_factory=dict)
    rounds: list[float] = field(default_factory=list)
    errors: int = 0  # Temporal's describe calls that failed
    database_errors: int = 0  # rounds of the nodes' rows that failed

    def normal_gap(self, job_id: str) -> float:
        return STREAMED_GAP if job_id in self.streamed else NORMAL_GAP

    def resumed(self, job_id: str) -> Resumed:
        """From the fault to the heartbeat that ended the attempt's last silence longer
        than its normal gap (NORMAL_GAP, or STREAMED_GAP for its node's row), or to its
        first heartbeat after the fault if it had none; and the longest silence from its
        last heartbeat before the fault on. A heartbeat already under way at the fault (the
        node's report was at the server, the server's call at Temporal) may land just after
        it; the silence that follows is what counts, not that one. A streamed attempt on a
        spared node with no such silence was heard throughout."""
        times = self.beats.get(job_id, [])
        after = [t for t in times if t > self.at]
        if not after:
            return Resumed(None, None)
        before = [t for t in times if t <= self.at]
        run = before[-1:] + after
        gaps = [(b - a, b) for a, b in itertools.pairwise(run)]
        longest = max((g for g, _ in gaps), default=None)
        long = [b for g, b in gaps if g > self.normal_gap(job_id)]
        if long:
            return Resumed(long[-1] - self.at, longest)
        if job_id in self.streamed and job_id not in self.hit and before:
            return Resumed(None, longest, heard_throughout=True)
        return Resumed(after[0] - self.at, longest)


async def through_fault(
    files: ClusterFiles,
    watched: list[Watched],
    strike: Callable[[], float],
    bound: float,
    ending: ProcessHandle | None = None,
    struck: str | None = None,
) -> Recovery:
    """Each attempt's heartbeats (one round before STRIKE, which causes the fault and says
    when), then until each has one more than its settle time after the fault (or is no
    longer pending), each agent is back and ENDING (the process the fault ends) has exited,
    or BOUND seconds passed. A streamed attempt's heartbeats are its node's row, heard
    through any server that is up but STRUCK (the server the fault took); any other's,
    Temporal's record of its activity."""
    found = Recovery()
    rows = Rows(files.main_db)
    try:
        jobs = [j for w in watched for j in w.jobs]
        found.streamed = await rows.paths(jobs)
        found.hit = {j for w in watched if w.hit for j in w.jobs}
        client = None
        if set(jobs) - found.streamed:
            client = await Client.connect(
                TEMPORAL, namespace=NAMESPACE, tls=server_credentials(files).tls()
            )
        await watch(found, watched, rows, client, strike, bound, ending, struck)
    finally:
        await rows.close()
    return found


async def watch(
    found: Recovery,
    watched: list[Watched],
    rows: Rows,
    client: Client | None,
    strike: Callable[[], float],
    bound: float,
    ending: ProcessHandle | None,
    struck: str | None,
) -> None:
    """through_fault's polling, into FOUND."""
    watching = [j for w in watched for j in w.jobs]
    away = {w.name: w for w in watched}
    limit = asyncio.Semaphore(DESCRIBES_AT_ONCE)
    excluded: list[str] = []  # STRUCK, from the fault on

    def record(job_id: str, seen: float | str) -> None:
        if seen == "gone":
            found.gone.append(job_id)
        elif isinstance(seen, float):
            times = found.beats.setdefault(job_id, [])
            if not times or seen > times[-1]:
                times.append(seen)

    async def activity(job_id: str) -> None:
        assert client is not None
        async with limit:
            seen = await last_heartbeat(client, job_id, "attempt-1")
        if seen == "error":
            found.errors += 1
        record(job_id, seen)

    async def streamed(job_ids: list[str]) -> None:
        if not job_ids:
            return
        heard = await rows.heard(job_ids, excluded)
        if "error" in heard.values():
            found.database_errors += 1
        for job_id, seen in heard.items():
            record(job_id, seen)

    async def round_of_heartbeats() -> None:
        began = time.monotonic()
        await asyncio.gather(
            streamed([j for j in watching if j in found.streamed]),
            *(activity(j) for j in watching if j not in found.streamed),
        )
        found.rounds.append(time.monotonic() - began)
        await asyncio.sleep(max(0.0, HEARTBEAT_POLL - (time.monotonic() - began)))

    def settled(job_id: str) -> bool:
        times = found.beats.get(job_id, [])
        settle = STREAMED_SETTLE if job_id in found.streamed else SETTLE
        return job_id in found.gone or bool(times and times[-1] > found.at + settle)

    async def heartbeats(deadline: float) -> None:
        while watching and time.monotonic() < deadline:
            await round_of_heartbeats()
            watching[:] = [j for j in watching if not settled(j)]

    async def streams(deadline: float) -> None:
        running = ending
        while (away or running) and time.monotonic() < deadline:
            for name, w in list(away.items()):
                if w.back(w.agent.reported()):
                    found.reconnect_s[name] = took = time.time() - found.at
                    del away[name]
                    if w.hit and took > SLOW_RECONNECT and len(found.slow) < 3:
                        found.slow[name] = logged_since(w.agent, found.at)
            if running is not None and running.poll() is not None:
                found.exited_s = time.time() - found.at
                running = None
            await asyncio.sleep(STATUS_POLL)

    await round_of_heartbeats()
    found.at = strike()
    if struck is not None:
        excluded.append(struck)
    deadline = time.monotonic() + bound
    await asyncio.gather(heartbeats(deadline), streams(deadline))


def logged_since(agent: AgentProcess, since: float) -> list[str]:
    """The agent's log lines stamped at SINCE (wall clock) or later, at most 20."""
    stamp = dt.datetime.fromtimestamp(since - 0.5).strftime("%Y-%m-%d %H:%M:%S,%f")[:23]
    lines = [line[:300] for line in agent.log().splitlines() if line[:23] >= stamp]
    return lines[:20]


def recovery_summary(watched: list[Watched], found: Recovery) -> dict[str, Any]:
    def beats(group: list[Watched]) -> dict[str, Any]:
        jobs = [j for w in group for j in w.jobs]
        resumed = [found.resumed(j) for j in jobs]
        took = [r.after_s for r in resumed if r.after_s is not None]
        heard = sum(r.heard_throughout for r in resumed)
        streamed = sum(j in found.streamed for j in jobs)
        return {
            "nodes": len(group),
            "attempts": len(jobs),
            # Where the figures came from: the node's row (streamed parts) or Temporal's
            # record of the attempt's activity.
            "paths": {"streamed": streamed, "activity": len(jobs) - streamed},
            "heartbeats_resumed_ms": percentiles(took),
            "longest_silence_ms": percentiles(
                [r.longest_silence_s for r in resumed if r.longest_silence_s is not None]
            ),
            "not_resumed": len(jobs) - len(took) - heard,
            "heard_throughout": heard,
            f"over_{RESUME_GOAL:g}s": sum(t > RESUME_GOAL for t in took),
        }

    hit = [w for w in watched if w.hit]
    reconnected = [found.reconnect_s[w.name] for w in hit if w.name in found.reconnect_s]
    return {
        "nodes_hit": beats(hit),
        "nodes_spared": beats([w for w in watched if not w.hit]),
        "hit_nodes_reconnected_ms": percentiles(reconnected),
        "hit_nodes_not_reconnected": len(hit) - len(reconnected),
        "activities_gone": sum(j not in found.streamed for j in found.gone),
        "parts_gone": sum(j in found.streamed for j in found.gone),
        "poll_round_ms": percentiles(found.rounds),
        "describe_errors": found.errors,
        "database_errors": found.database_errors,
        "slow_reconnects_logged": found.slow,
    }


# --- a job's output, line by line --------------------------------------------------------


@dataclass
class Verdict:
    """What one job's end and output say."""

    job_id: str
    state: str
    attempts: int
    killed: bool
    lines_expected: int
    lines_missing: int = 0
    lines_duplicated: int = 0
    lines_out_of_order: int = 0
    lines_malformed: int = 0
    pids: int = 0
    restarted: bool = False
    stderr_bytes: int = 0
    first_printed: float | None = None

    @property
    def lost_bytes(self) -> int:
        return self.lines_missing * LINE


def judge(job: dict[str, Any], out: dict[int, bytes], stderr: int, lines: int) -> Verdict:
    attempts = job["attempts"]
    exited = [a for a in attempts if (a["ended_because"], a["exit_code"]) == ("exit", 0)]
    verdict = Verdict(
        str(job["id"]),
        str(job["state"]),
        len(attempts),
        killed=len(exited) != len(attempts) or not attempts,
        lines_expected=lines,
        stderr_bytes=stderr,
    )
    seen: Counter[int] = Counter()
    pids: set[str] = set()
    last = 0
    for data in out.values():
        for raw in data.splitlines(keepends=True):
            words = raw.split()
            if (
                len(raw) != LINE
                or not raw.endswith(b"\n")
                or len(words) != 4
                or not words[0].isdigit()
            ):
                verdict.lines_malformed += 1
                continue
            number = int(words[0])
            seen[number] += 1
            pids.add(words[1].decode())
            if verdict.first_printed is None:
                verdict.first_printed = float(words[2])
            if number <= last:
                verdict.lines_out_of_order += 1
            last = max(last, number)
    verdict.lines_missing = sum(1 for n in range(1, lines + 1) if n not in seen)
    verdict.lines_duplicated = sum(c - 1 for c in seen.values() if c > 1)
    verdict.pids = len(pids)
    verdict.restarted = len(pids) > 1 or seen[1] > 1 or len(out) > 1
    verdict.killed = verdict.killed or verdict.restarted
    return verdict


def verdicts_summary(verdicts: list[Verdict]) -> dict[str, Any]:
    return {
        "jobs": len(verdicts),
        "commands_killed": sum(v.killed for v in verdicts),
        "jobs_with_more_than_one_attempt": sum(v.attempts > 1 for v in verdicts),
        "output_lost_bytes": sum(v.lost_bytes for v in verdicts),
        "output_expected_bytes": sum(v.lines_expected * LINE for v in verdicts),
        "lines_missing": sum(v.lines_missing for v in verdicts),
        "lines_duplicated": sum(v.lines_duplicated for v in verdicts),
        "lines_out_of_order": sum(v.lines_out_of_order for v in verdicts),
        "lines_malformed": sum(v.lines_malformed for v in verdicts),
        "stderr_bytes": sum(v.stderr_bytes for v in verdicts),
        "commands_started_again": sum(v.restarted for v in verdicts),
        "states": dict(Counter(v.state for v in verdicts)),
        "jobs_not_succeeded": sum(v.state != "succeeded" for v in verdicts),
        "examples": [
            dataclasses.asdict(v)
            for v in verdicts
            if v.killed or v.attempts > 1 or v.lines_missing or v.state != "succeeded"
        ][:5],
    }


# --- the run -------------------------------------------------------------------------------


@dataclass
class Outlive:
    args: argparse.Namespace
    files: ClusterFiles
    servers: dict[str, ServerProcess]
    root: Path
    out: dict[str, Any]
    agents: list[AgentProcess] = field(default_factory=list)
    phases: dict[str, Any] = field(default_factory=dict)
    token: str = ""

    def progress(self) -> dict[str, Any]:
        return {
            "agents": len(self.agents),
            "agents_running": sum(a.running() for a in self.agents),
            "phases_done": list(self.phases),
        }

    def start_agents(self) -> list[str]:
        """N agents, agent i given edge i % 3 first; their node IDs once all run."""
        log(f"starting {self.args.nodes} agents")
        self.token = create_token(self.files, "bench.outlive")
        base = self.root / "agents"
        base.mkdir()
        began = time.monotonic()
        for i in range(self.args.nodes):
            edges = EDGES[i % 3 :] + EDGES[: i % 3]
            agent = AgentProcess.joining(
                base / f"node-{i}", edges, self.files.ca_hash, token=self.token
            )
            self.agents.append(agent.start())
        running = self.wait_running(self.agents, AGENTS_UP_TIMEOUT)
        self.phases["agents"] = {
            "agents": len(self.agents),
            "running": running,
            "up_s": round(time.monotonic() - began, 1),
            "by_server": dict(Counter(str(a.reported().get("server")) for a in self.agents)),
        }
        if running < len(self.agents):
            dead = [a for a in self.agents if not a.running()] or self.agents
            raise Failed(
                f"only {running} of {len(self.agents)} agents run:\n{dead[0].log()[-1500:]}"
            )
        return [str(a.reported()["node_id"]) for a in self.agents]

    @staticmethod
    def wait_running(agents: list[AgentProcess], within: float) -> int:
        deadline = time.monotonic() + within
        while True:
            running = sum(1 for a in agents if a.reported().get("runtime") == "running")
            if running == len(agents) or time.monotonic() > deadline:
                return running
            time.sleep(0.5)

    def wait_printed(self, job_ids: list[str]) -> dict[str, float]:
        deadline = time.monotonic() + PRINTED_TIMEOUT
        while True:
            seen = printed(self.files, job_ids)
            if len(seen) == len(job_ids):
                return seen
            if time.monotonic() > deadline:
                missing = sorted(set(job_ids) - set(seen))
                raise Failed(
                    f"{len(missing)} jobs printed nothing in {PRINTED_TIMEOUT} s: {missing[:5]}"
                )
            time.sleep(0.5)

    def wait_ended(self, job_ids: list[str], within: float) -> int:
        deadline = time.monotonic() + within
        while True:
            done = ended(self.files, job_ids)
            if done == len(job_ids) or time.monotonic() > deadline:
                return done
            time.sleep(1.0)

    def verdicts(self, job_ids: list[str], lines: int) -> list[Verdict]:
        client = survivor_api(self.files)
        return [judge(*stdout_of(client, j), lines) for j in job_ids]

    # --- 1-4: the servers ---------------------------------------------------------------

    def fleet(self) -> None:
        node_ids = self.start_agents()
        count, lines = self.args.commands, self.args.duration
        log(f"running {count} jobs of {lines} lines")
        began = time.monotonic()
        job_ids = submit(self.files, node_ids[:count], lines)
        first = self.wait_printed(job_ids)
        self.phases["running"] = {
            "jobs": len(job_ids),
            "all_printed_s": round(time.monotonic() - began, 1),
        }
        pairs = list(zip(self.agents[:count], job_ids, strict=True))
        kill_at = self.fault("kill", KILLED, signal.SIGKILL, pairs, first, lines)
        time.sleep(max(0.0, kill_at + self.args.lull - time.time()))
        self.fault("drain", DRAINED, signal.SIGTERM, pairs, first, lines)
        log("waiting for every job to end")
        done = self.wait_ended(job_ids, lines + END_MARGIN)
        self.phases["finish"] = {"ended": done, **verdicts_summary(self.verdicts(job_ids, lines))}

    def fault(
        self,
        name: str,
        address: str,
        sig: signal.Signals,
        pairs: list[tuple[AgentProcess, str]],
        first: dict[str, float],
        lines: int,
    ) -> float:
        """SIG to the server on ADDRESS; how the attempts and nodes came back. When."""
        server = self.servers[address]
        assert server.process is not None
        process = server.process
        target = server_ids(self.files)[address]

        def elsewhere(reported: dict[str, Any]) -> bool:
            return reported.get("connected") is True and reported.get("server") != target

        watched = [
            Watched(f"agent {i}", agent, [job_id], agent.reported().get("server") == target,
                    elsewhere)
            for i, (agent, job_id) in enumerate(pairs)
        ]  # fmt: skip
        hosts = server.children() if self.args.kill_host and sig == signal.SIGKILL else []
        log(f"{name}: {sig.name} to {address} ({sum(w.hit for w in watched)} nodes on it)")

        def strike() -> float:
            at = time.time()
            process.send_signal(sig)
            for pid in hosts:  # read before: a dead server's children are no longer its own
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            return at

        stamp = utc_stamp()
        found = asyncio.run(
            through_fault(self.files, watched, strike, RECOVERY_BOUND, process, target)
        )
        self.phases[name] = {
            "signal": sig.name,
            "server": address,
            "temporal_host_killed_too": bool(hosts),
            "at_utc": stamp,
            "commands_running_then": sum(first[j] + lines > found.at for _, j in pairs),
            "server_exited_s": None if found.exited_s is None else round(found.exited_s, 2),
            **recovery_summary(watched, found),
        }
        log(f"{name}: {json.dumps(self.phases[name])}")
        return found.at

    # --- 5: the agent's own restart -----------------------------------------------------

    def agent_restart(self) -> None:
        count, lines = self.args.restart_commands, self.args.restart_duration
        data = self.root / "agents" / "restarted"
        current = AgentProcess.joining(
            data, [EDGES[2], EDGES[0], EDGES[1]], self.files.ca_hash, token=self.token,
            max_jobs=count,
        ).start()  # fmt: skip
        self.agents.append(current)
        if self.wait_running([current], AGENTS_UP_TIMEOUT) != 1:
            raise Failed(
                f"the agent with --max-jobs {count} does not run:\n{current.log()[-1500:]}"
            )
        node = str(current.reported()["node_id"])
        log(f"agent restart: {count} jobs of {lines} lines on one node (--max-jobs {count})")
        job_ids = submit(self.files, [node] * count, lines)
        first = self.wait_printed(job_ids)
        section: dict[str, Any] = {"max_jobs": count}
        self.phases["agent_restart"] = section
        for how in ("kill -9", "SIGTERM"):
            current, at, section[how] = self.restart_agent(current, data, how, job_ids)
            section[how]["commands_running_then"] = sum(first[j] + lines > at for j in job_ids)
            log(f"agent restart ({how}): {json.dumps(section[how])}")
        done = self.wait_ended(job_ids, lines + END_MARGIN)
        section["finish"] = {"ended": done, **verdicts_summary(self.verdicts(job_ids, lines))}

    def restart_agent(
        self, old: AgentProcess, data: Path, how: str, job_ids: list[str]
    ) -> tuple[AgentProcess, float, dict[str, Any]]:
        """HOW ends OLD; a new agent starts at once on DATA. The new one, when HOW struck,
        and the figures."""
        assert old.process is not None
        process = old.process
        new: list[AgentProcess] = []
        times: dict[str, float] = {}
        # The log is one file across the node's agents: what the new one adds comes after.
        logged = len(old.log())

        def back(reported: dict[str, Any]) -> bool:
            pid = new[0].process.pid if new and new[0].process else None
            return reported.get("pid") == pid and reported.get("connected") is True

        watched = [Watched("agent", old, job_ids, True, back)]

        def strike() -> float:
            at = time.time()
            if how == "kill -9":
                process.kill()
            else:
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(AGENT_EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                raise Failed(
                    f"the agent did not exit within {AGENT_EXIT_TIMEOUT} s of {how}"
                ) from None
            times["exited"] = time.time() - at
            new.append(AgentProcess.resuming(data).start())
            self.agents.append(new[0])
            times["started"] = time.time() - at
            return at

        found = asyncio.run(through_fault(self.files, watched, strike, RECOVERY_BOUND))
        summary = recovery_summary(watched, found)
        return (
            new[0],
            found.at,
            {
                "old_agent_exited_s": round(times["exited"], 2),
                "new_agent_started_s": round(times["started"], 2),
                "reattached": new[0].log()[logged:].count("re-attached job"),
                **summary["nodes_hit"],
                "reconnected_ms": summary["hit_nodes_reconnected_ms"],
                "activities_gone": summary["activities_gone"],
                "parts_gone": summary["parts_gone"],
                "poll_round_ms": summary["poll_round_ms"],
                "describe_errors": summary["describe_errors"],
                "database_errors": summary["database_errors"],
            },
        )


def goals(phases: dict[str, Any]) -> dict[str, Any]:
    """The issue's goals, each with the figure it is judged on."""
    found: dict[str, Any] = {}
    if "finish" in phases:
        finish = phases["finish"]
        found["commands_killed"] = finish["commands_killed"]
        found["jobs_with_a_second_attempt"] = finish["jobs_with_more_than_one_attempt"]
        found["output_lost_bytes"] = finish["output_lost_bytes"]
    for name in ("kill", "drain"):
        if name in phases:
            worst = [
                phases[name][group]["heartbeats_resumed_ms"]["max"]
                for group in ("nodes_hit", "nodes_spared")
            ]
            not_resumed = sum(
                phases[name][group]["not_resumed"] for group in ("nodes_hit", "nodes_spared")
            )
            known = [w for w in worst if w is not None]
            found[f"{name}_heartbeats_resumed_max_ms"] = max(known) if known else None
            found[f"{name}_under_{RESUME_GOAL:g}s"] = (
                bool(known) and not_resumed == 0 and max(known) < RESUME_GOAL * 1000
            )
    if "agent_restart" in phases:
        found["agent_restart_commands_killed"] = phases["agent_restart"]["finish"][
            "commands_killed"
        ]
    return found


def measure(bench: Outlive) -> None:
    if not trio.run(wait_until_servers, bench.files, len(bench.servers)):
        raise Failed(f"not all {len(bench.servers)} servers were up")
    time.sleep(2.5)  # one more round of every edge's directory
    bench.out["phases_utc"] = [utc_stamp(), None]
    bench.fleet()
    bench.agent_restart()
    bench.out["phases_utc"][1] = utc_stamp()
    bench.out["goals"] = goals(bench.phases)


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nodes", type=int, default=100, help="real agents")
    parser.add_argument("--commands", type=int, default=100, help="running jobs, one a node")
    parser.add_argument("--duration", type=int, default=60, help="seconds (lines) per command")
    parser.add_argument("--lull", type=float, default=10.0, help="seconds from kill to drain")
    parser.add_argument(
        "--restart-commands", type=int, default=10, help="jobs on the agent that restarts"
    )
    parser.add_argument("--restart-duration", type=int, default=30, help="seconds (lines) of those")
    parser.add_argument(
        "--kill-host",
        action="store_true",
        help="SIGKILL the killed server's Temporal host too (a machine that dies)",
    )


def check(args: argparse.Namespace) -> str | None:
    if not 1 <= args.commands <= args.nodes:
        return "need 1 <= --commands <= --nodes (one job a node)"
    if not 1 <= args.restart_commands <= 256:
        return "--restart-commands is the agent's --max-jobs: 1 to 256"
    if args.duration < args.lull + 10 or args.restart_duration < 20:
        # The faults must land on commands that still run.
        return "need --duration >= --lull + 10 and --restart-duration >= 20"
    return None


def run(bench: runner.Bench) -> None:
    outlive = Outlive(bench.args, bench.files, bench.servers, bench.root, bench.out)
    bench.out["phases"] = outlive.phases
    bench.progress = outlive.progress
    try:
        measure(outlive)
    finally:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda a: a.stop(), outlive.agents))


SCENARIO = Scenario(
    "outlive",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda _: ADDRESSES,
    check=check,
    measured=("oz0", "cli", "oz0_node"),
    # The scenario kills and stops servers itself.
    watch_servers=False,
)
