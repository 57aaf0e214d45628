"""A picture of the shipped Grafana dashboard, from a real run (issue 45).

    python -m bench.dashboard_picture [--out PNG] [--agents A] [--duration S]
                                      [--keep-data JSON] [--server-logs DIR]

The runner (bench/runner.py) starts a fresh test cluster and three real servers on
127.0.0.229, .230 and .231 (default ports). Then:

1. a real Prometheus (Debian's `prometheus`, bench/prometheus.py) on 127.0.0.232:9090
   scrapes every server's `/metrics` every 5 s as docs/monitoring.md says (TLS checked
   against the cluster CA, job `orchestrator-zero`), the shipped alerting rules loaded;
2. A real agents (`python -m oz0_node.main start`, fixtures/agent.py) join with one
   unlimited token, agent i given server i % 3's edge first; one more agent tries a
   used-up one-use token (a refused join);
3. for S seconds, a job every JOB_EVERY seconds through .229's management API (the
   cluster context's operator, cli.client.ApiClient): `--all` jobs of which some parts
   fail, jobs on one node (some failing, some past their timeout, some waiting for a
   blocked node), and on a schedule of its own: two nodes blocked and unblocked 30 s
   later; server .230's Temporal host killed (the server starts it again); server .231
   stopped (SIGTERM) and started again, with the per-person caps at their defaults (the
   runner lifts them), then bursts of requests to it past the request cap (curl, as
   tests/test_deploy_monitoring.py sends them);
4. after two more scrapes, every panel of deploy/grafana/orchestrator-zero.json is
   answered by Prometheus' HTTP API with the panel's own queries, Grafana's variables
   given the values Grafana would give them (bench/dashboard_panels.py: $job from
   `label_values`, $instance All, $__rate_interval from the scrape interval), a range
   query (`/api/v1/query_range`) for a range target and an instant one for an instant
   target, and drawn (bench/dashboard_draw.py) to PNG.

Its figures: the panels and the queries that had no data (an empty panel means a query or
a metric is wrong), the alerts that were pending or firing during the run, what the
workload did, and how many rules Prometheus loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg

from bench import dashboard_draw
from bench.dashboard_panels import (
    Variables,
    grafana_intervals,
    label_values_query,
    load,
    template_values,
)
from bench.prometheus import Prometheus, Series
from bench.runner import Bench, Scenario, create_token, log
from cli.client import ApiClient
from fixtures import operator_certs
from fixtures.agent import AgentProcess, connected, stop_all
from fixtures.cluster import ServerProcess, kill_all
from oz0 import audit, tokens
from oz0.context import MANAGEMENT_PORT, Context
from oz0_common.addresses import EDGE_PORT

ADDRESSES = ("127.0.0.229", "127.0.0.230", "127.0.0.231")
PROMETHEUS = "127.0.0.232:9090"
API = f"{ADDRESSES[0]}:{MANAGEMENT_PORT}"
HOST_KILLED = ADDRESSES[1]
RESTARTED = ADDRESSES[2]
SCRAPE_S = 5.0
# Grafana draws at most about a point per pixel of a panel: its $__interval for a range
# of minutes is the scrape interval (grafana_intervals).
MAX_POINTS = 1000
JOB_EVERY = 4.0
AGENTS_UP_TIMEOUT = 180.0
SERVER_START_TIMEOUT = 180.0
BURST = 600
REPO = Path(__file__).resolve().parent.parent.parent
DEFAULT_OUT = REPO / "docs" / "img" / "dashboard.png"

# Each job of the cycle: (what, the request's body less tenant; "NODE" is a node's ID).
JOBS: list[tuple[str, dict[str, Any]]] = [
    # Exit 1 where the part's shell has a PID divisible by 4: about a quarter fail.
    ("all, some fail", {"all": True, "command": ["sh", "-c", "sleep 2; exit $(($$ % 4 == 0))"]}),
    ("one node, 8 s", {"node": "NODE", "command": ["sleep", "8"]}),
    ("all, true", {"all": True, "command": ["true"]}),
    ("one node, exit 3", {"node": "NODE", "command": ["sh", "-c", "exit 3"]}),
    ("one node, past its timeout", {"node": "NODE", "command": ["sleep", "30"], "timeout": 3}),
    ("one node, 1 s", {"node": "NODE", "command": ["sleep", "1"]}),
]
# Seconds into the workload: what the operator does besides running jobs.
EVENTS = (
    (20.0, "refused join"),
    (45.0, "block"),
    (75.0, "unblock"),
    (100.0, "kill Temporal host"),
    (120.0, "restart server"),
    (190.0, "burst"),
    (220.0, "burst"),
)


@dataclasses.dataclass
class Workload:
    bench: Bench
    client: ApiClient
    nodes: list[str]
    jobs: dict[str, int] = dataclasses.field(default_factory=dict)
    refused_jobs: list[str] = dataclasses.field(default_factory=list)
    events: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    threads: list[threading.Thread] = dataclasses.field(default_factory=list)
    blocked: list[str] = dataclasses.field(default_factory=list)
    began: float = 0.0
    # Set once the restarted server is up again: the bursts are for it.
    restarted: threading.Event = dataclasses.field(default_factory=threading.Event)

    def note(self, what: str, **details: Any) -> None:
        at = round(time.monotonic() - self.began, 1)
        self.events.append({"at_s": at, "what": what, **details})
        log(f"{at:6.1f} s: {what} {details or ''}")

    def in_thread(self, what: str, work: Callable[[], None]) -> None:
        def run() -> None:
            try:
                work()
            except Exception as e:  # the picture goes on; the document says what failed
                self.note(f"{what} failed", error=f"{type(e).__name__}: {e}"[:300])

        thread = threading.Thread(target=run, name=what, daemon=True)
        thread.start()
        self.threads.append(thread)

    def run_job(self, n: int) -> None:
        what, body = JOBS[n % len(JOBS)]
        body = dict(body, tenant="default")
        if body.get("node") == "NODE":
            body["node"] = self.nodes[n % len(self.nodes)]
        try:
            self.client.post("/api/v1/jobs", body)
            self.jobs[what] = self.jobs.get(what, 0) + 1
        except Exception as e:
            self.refused_jobs.append(f"{what}: {type(e).__name__}: {e}"[:200])

    def event(self, what: str) -> None:
        if what == "refused join":
            self.refused_join()
        elif what == "block":
            self.blocked = self.nodes[1:3]
            for node in self.blocked:
                self.client.post(f"/api/v1/nodes/{node}/block", {"reason": "dashboard picture"})
            self.note("blocked", nodes=self.blocked)
        elif what == "unblock":
            for node in self.blocked:
                self.client.post(f"/api/v1/nodes/{node}/unblock", {})
            self.note("unblocked", nodes=self.blocked)
        elif what == "kill Temporal host":
            server = self.bench.servers[HOST_KILLED]
            hosts = server.children()
            for pid in hosts:
                os.kill(pid, signal.SIGKILL)
            self.note("Temporal host killed", server=HOST_KILLED, pids=hosts)
        elif what == "restart server":
            self.in_thread(what, self.restart)
        elif what == "burst":
            self.in_thread(what, self.burst)

    def refused_join(self) -> None:
        """A one-use token, used by one agent, then tried by another: refused."""
        files = self.bench.files
        with (
            psycopg.connect(files.main_db, autocommit=True) as c,
            c.transaction(),
        ):
            _, token = tokens.create(
                c, tenant="default", ttl=None, max_uses=1, labels={},
                description="dashboard picture: one use", actor=audit.Actor("operator", "bench"),
            )  # fmt: skip
        base = self.bench.root / "agents"
        edges = [f"{a}:{EDGE_PORT}" for a in ADDRESSES]
        late = [
            AgentProcess.joining(base / name, edges, files.ca_hash, token=token).start()
            for name in ("one-use", "one-use-again")
        ]
        self.bench.cleanups.callback(stop_all, late)
        self.note("two agents try one one-use token")

    def restart(self) -> None:
        old = self.bench.servers[RESTARTED]
        began = time.monotonic()
        kill_all([old])
        stopped = time.monotonic() - began
        self.note("server stopped", server=RESTARTED, stop_s=round(stopped, 1))
        time.sleep(10)
        files, root = self.bench.files, self.bench.root
        # The caps at their defaults (the runner lifts them for what it measures): the
        # bursts below hit them.
        new = ServerProcess.for_cluster(files, RESTARTED, workdir=root / f"{RESTARTED}-again")
        self.bench.servers[RESTARTED] = new
        began = time.monotonic()
        new.start(timeout=SERVER_START_TIMEOUT)
        took = round(time.monotonic() - began, 1)
        self.note("server started again", server=RESTARTED, start_s=took)
        self.restarted.set()

    def burst(self) -> None:
        """BURST requests at once on one connection (curl's URL glob), each answered 400
        for its job ID, or 429 past the person's request cap."""
        if not self.restarted.wait(SERVER_START_TIMEOUT):
            raise TimeoutError(f"{RESTARTED} is not up again")
        admin = operator_certs.OperatorFiles(self.bench.files.context_dir)
        answers = self.bench.root / "burst" / str(time.monotonic_ns())
        done = subprocess.run(
            ["curl", "-sk", "--max-time", "60", *admin.curl_args, "--create-dirs",
             "-o", f"{answers}/#1", "--write-out", "%{http_code}\n",
             f"https://{RESTARTED}:{MANAGEMENT_PORT}/api/v1/jobs/not-a-job-[1-{BURST}]"],
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        codes = done.stdout.split()
        self.note("burst", server=RESTARTED, sent=len(codes), refused_429=codes.count("429"))


def start_agents(bench: Bench, count: int) -> tuple[list[AgentProcess], list[str]]:
    files = bench.files
    token = create_token(files, "dashboard picture")
    (bench.root / "agents").mkdir(exist_ok=True)
    edges = [f"{a}:{EDGE_PORT}" for a in ADDRESSES]
    agents = [
        AgentProcess.joining(
            bench.root / "agents" / f"node-{i}",
            edges[i % 3 :] + edges[: i % 3],
            files.ca_hash,
            token=token,
            labels={"bench": "dashboard-picture"},
        )
        for i in range(count)
    ]
    bench.cleanups.callback(stop_all, agents)
    for agent in agents:
        agent.start()
    deadline = time.monotonic() + AGENTS_UP_TIMEOUT
    while not all(connected(a.reported()) for a in agents):
        if time.monotonic() > deadline:
            up = sum(connected(a.reported()) for a in agents)
            raise TimeoutError(f"{up} of {count} agents connected in {AGENTS_UP_TIMEOUT:g} s")
        time.sleep(0.5)
    return agents, [str(a.reported()["node_id"]) for a in agents]


def fetch(prometheus: Prometheus, start: float, end: float) -> dict[str, Any]:
    """Every panel's queries answered, as bench.dashboard_draw draws them."""
    board, panels = load()
    found: dict[str, list[str]] = {}
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":
            match, label = label_values_query(variable)
            found[variable["name"]] = prometheus.label_values(label, match)
    interval, rate_interval = grafana_intervals(end - start, MAX_POINTS, SCRAPE_S)
    variables = Variables(template_values(board, found), interval, rate_interval, end - start)
    answers: dict[str, list[dict[str, Any]]] = {}
    for panel in panels:
        for target in panel.targets:
            expr = variables.substitute(target.expr)
            series: list[Series] = (
                prometheus.query(expr, end)
                if target.instant
                else prometheus.query_range(expr, start, end, interval)
            )
            answers.setdefault(str(panel.id), []).append(
                {"ref": target.ref, "legend": target.legend, "expr": expr,
                 "series": [s.to_json() for s in series]}
            )  # fmt: skip
    return {
        "start": start,
        "end": end,
        "step_s": interval,
        "rate_interval_s": rate_interval,
        "variables": variables.values,
        "shown_variables": {
            "Data source": "Prometheus",
            "Job": ", ".join(found.get("job", [])),
            "Server": "All",
        },
        "panels": answers,
    }


def empty_queries(fetched: dict[str, Any]) -> list[str]:
    _, panels = load()
    titles = {str(p.id): p.title for p in panels}
    return [
        f"{titles[pid]} {a['ref']}: {a['expr']}"
        for pid, targets in fetched["panels"].items()
        for a in targets
        if not any(Series.from_json(s).has_data for s in a["series"])
    ]


def alerts_seen(prometheus: Prometheus, start: float, end: float) -> dict[str, list[str]]:
    """Each alert that was pending or firing at some point of the run, and its states."""
    seen: dict[str, set[str]] = {}
    for series in prometheus.query_range("ALERTS", start, end, SCRAPE_S):
        name = series.labels.get("alertname", "?")
        seen.setdefault(name, set()).add(series.labels.get("alertstate", "?"))
    return {name: sorted(states) for name, states in sorted(seen.items())}


def run(bench: Bench) -> None:
    args = bench.args
    out = bench.out
    context = Context.load(bench.files.context_path)
    prometheus = Prometheus(PROMETHEUS, bench.root / "prometheus")
    bench.cleanups.callback(prometheus.stop)
    targets = [f"{a}:{MANAGEMENT_PORT}" for a in ADDRESSES]
    prometheus.start(targets, context.ca_path, SCRAPE_S)
    start = time.time()
    build = prometheus.api("status/buildinfo")
    rules = prometheus.api("rules")
    out["prometheus"] = {
        "address": PROMETHEUS,
        "version": build.get("version"),
        "scrape_interval_s": SCRAPE_S,
        "rules_loaded": sum(len(g["rules"]) for g in rules["groups"]),
    }
    log(f"Prometheus {build.get('version')}: {out['prometheus']['rules_loaded']} rules loaded")
    bench.phase[0] = "agents joining"
    agents, nodes = start_agents(bench, args.agents)
    log(f"{len(agents)} agents connected")
    api_context = dataclasses.replace(context, servers=(API,), learned=())
    client = ApiClient(api_context, learn_servers=False)
    bench.cleanups.callback(client.close)
    work = Workload(bench, client, nodes, began=time.monotonic())
    bench.phase[0] = "workload"
    bench.progress = lambda: {"events": work.events, "jobs": work.jobs}
    events = list(EVENTS)
    for n in itertools.count():
        now = time.monotonic() - work.began
        if now >= args.duration:
            break
        while events and events[0][0] <= now:
            work.event(events.pop(0)[1])
        work.run_job(n)
        time.sleep(max(0.0, (n + 1) * JOB_EVERY - (time.monotonic() - work.began)))
    for thread in work.threads:
        thread.join(SERVER_START_TIMEOUT)
    # Two more scrapes, so that the last of the workload is in every panel.
    time.sleep(2 * SCRAPE_S + 1)
    end = time.time()
    bench.phase[0] = "drawing"
    fetched = fetch(prometheus, start, end)
    source = out["source"]
    fetched["caption"] = (
        "orchestrator-zero's dashboard (deploy/grafana/orchestrator-zero.json): its panels' "
        f"own queries answered by a real Prometheus {build.get('version')} scraping "
        f"{len(ADDRESSES)} real servers every {SCRAPE_S:g} s under bench.dashboard_picture's "
        f"workload ({args.agents} real agents), drawn by bench/dashboard_draw.py (no Grafana). "
        f"Commit {source}, {dt.datetime.now(dt.UTC):%Y-%m-%d}."
    )
    if args.keep_data:
        args.keep_data.parent.mkdir(parents=True, exist_ok=True)
        args.keep_data.write_text(json.dumps(fetched))
    empty = dashboard_draw.draw(fetched, args.out)
    out["picture"] = str(args.out)
    out["range_s"] = round(end - start, 1)
    out["step_s"] = fetched["step_s"]
    out["rate_interval_s"] = fetched["rate_interval_s"]
    out["panels_without_data"] = empty
    out["queries_without_data"] = empty_queries(fetched)
    out["alerts_pending_or_firing"] = alerts_seen(prometheus, start, end)
    out["workload"] = {
        "agents": len(agents),
        "jobs_sent": work.jobs,
        "jobs_refused": work.refused_jobs[:10],
        "events": work.events,
    }
    out["prometheus"]["targets"] = [
        {"url": t["scrapeUrl"], "health": t["health"], "last_error": t["lastError"]}
        for t in prometheus.api("targets")["activeTargets"]
    ]
    with contextlib.suppress(Exception):
        out["prometheus"]["log_tail"] = prometheus.log().splitlines()[-5:]
    log(f"drew {args.out}; panels without data: {empty or 'none'}")


def arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the PNG to write")
    parser.add_argument("--agents", type=int, default=15)
    parser.add_argument(
        "--duration", type=float, default=250.0, help="seconds of workload (events need 230)"
    )
    parser.add_argument(
        "--keep-data", type=Path, metavar="JSON",
        help="keep Prometheus' answers here (python -m bench.dashboard_draw draws them again)",
    )  # fmt: skip


def check(args: argparse.Namespace) -> str | None:
    if not 3 <= args.agents <= 40:
        return "--agents: 3 to 40"
    if args.duration < 230:
        return "--duration: at least 230 s (the workload's events)"
    return None


SCENARIO = Scenario(
    "dashboard_picture",
    __doc__ or "",
    arguments,
    run_blocking=run,
    servers=lambda _: ADDRESSES,
    check=check,
    # A server is stopped and started again on purpose.
    watch_servers=False,
    measured=("oz0", "cli", "deploy", "bench"),
)
