"""Schedules on Temporal Schedules, with real servers, real Temporal and a real agent
(127.0.0.251, and .252 for the second server of the last test).

What an operator sees through `orchestrator-zero schedule ...` and `job list --schedule`:
a trigger runs one job now, audited as started by the schedule and created by its maker;
`skip` never runs two at once; pause stops runs and unpause resumes them; an operator of
another tenant sees none of it; a bad cron expression or time zone is one line; a cron of
every minute starts a job just after the minute; a server killed does not stop a schedule.
"""

from __future__ import annotations

import datetime as dt
import http.client
import json
import re
import signal
import ssl
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cli import client
from fixtures import operator_certs
from fixtures.agent import AgentProcess
from fixtures.cluster import ClusterFiles
from oz0 import passwords
from oz0.context import Context
from tests.conftest import CliRunner
from tests.test_jobs_e2e import StartServer, api, join_agents

SERVER, SECOND = "127.0.0.251", "127.0.0.252"
ADVERTISE = SERVER  # what cluster_files (tests/conftest.py) advertises
EDGE = f"{SERVER}:7443"
# Never due while a test runs: its runs are the ones triggered.
NEVER = "0 0 1 1 *"
# Generous bounds for a loaded 2-core machine; the benchmark reports the real figures.
RUN_BOUND = 30.0
CRON_BOUND = 10.0
WEB_PASSWORD = "a long enough web password"


def jobs_of(cli: CliRunner, env: dict[str, str], schedule_id: str) -> list[dict[str, Any]]:
    listed = cli("job", "list", "--schedule", schedule_id, "--json", env=env)
    assert listed.code == 0, listed.err
    jobs: list[dict[str, Any]] = listed.json()
    return jobs


def wait_for(what: str, check: Callable[[], Any], timeout: float, step: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(step)


def create(cli: CliRunner, env: dict[str, str], *args: str) -> str:
    made = cli("schedule", "create", "--json", *args, env=env)
    assert made.code == 0, made.err
    return str(made.json()["id"])


def ended(jobs: list[dict[str, Any]]) -> bool:
    return bool(jobs) and all(j["ended_at"] is not None for j in jobs)


def overlapping(files: ClusterFiles, jobs: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """Pairs of these jobs whose attempts ran at the same time (from their recorded start and
    end times)."""
    spans = []
    for job in jobs:
        for a in api(files).get(f"/api/v1/jobs/{job['id']}")["attempts"]:
            end = a["ended_at"] or dt.datetime.now(dt.UTC).isoformat()
            spans.append((job["id"], dt.datetime.fromisoformat(a["started_at"]),
                          dt.datetime.fromisoformat(end)))  # fmt: skip
    return [
        (a[0], b[0])
        for i, a in enumerate(spans)
        for b in spans[i + 1 :]
        if a[0] != b[0] and a[1] < b[2] and b[1] < a[2]
    ]


def web(
    files: ClusterFiles,
    method: str,
    path: str,
    cookie: str = "",
    form: dict[str, str] | None = None,
) -> tuple[int, str, str]:
    """One request to the web UI as its own pages make it: status, body, Set-Cookie."""
    ctx = Context.load(files.context_path)
    tls = ssl.create_default_context(cafile=str(ctx.ca_path))
    tls.check_hostname = False
    https: http.client.HTTPSConnection = client.connection(SERVER, 8443, tls, timeout=10)
    try:
        headers = {"Cookie": cookie, "Accept": "text/html", "Sec-Fetch-Site": "same-origin"}
        body = None
        if form is not None:
            headers["Content-Type"] = "application/x-www-form-urlencoded"
            body = urllib.parse.urlencode(form)
        https.request(method, path, body, headers)
        answer = https.getresponse()
        return answer.status, answer.read().decode(), answer.getheader("Set-Cookie") or ""
    finally:
        https.close()


def web_account(files: ClusterFiles, name: str) -> tuple[str, str]:
    """A web UI account for operator NAME, signed in: its cookie and CSRF token."""
    with psycopg.connect(files.url.for_database(files.url.names.main), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ui_accounts (username, password_hash) VALUES (%s, %s)",
            (name, passwords.hash_password(WEB_PASSWORD)),
        )
    status, _, cookie = web(
        files, "POST", "/sign-in", form={"username": name, "password": WEB_PASSWORD}
    )
    assert status == 303, status
    cookie = cookie.split(";", 1)[0]
    _, page, _ = web(files, "GET", "/schedules", cookie)
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, page[:500]
    return cookie, found.group(1)


@pytest.mark.slow
def test_trigger_skip_pause_scope_and_bad_specs(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    start_server(files, SERVER)
    [node] = join_agents(cli, files, tmp_path, agents, [{"role": "web"}], edges=[EDGE])

    # A trigger runs one now: an ordinary job, created by the schedule's maker, audited as
    # started by the schedule.
    now = create(cli, env, "--cron", NEVER, "--selector", "role=web", "--env", "WHO=cron",
                 "--", "sh", "-c", 'echo "hello from $WHO on $OZ0_NODE_ID"')  # fmt: skip
    assert cli("schedule", "trigger", now, env=env).code == 0
    [job] = wait_for("the triggered run's job", lambda: jobs_of(cli, env, now), RUN_BOUND)
    wait_for("the job's end", lambda: ended(jobs_of(cli, env, now)), RUN_BOUND)
    [done] = jobs_of(cli, env, now)
    assert done["state"] == "succeeded", done
    assert done["schedule"] == now and done["created_by"].startswith("operator:")
    logs = cli("job", "logs", job["id"], env=env)
    assert logs.out == f"hello from cron on {node}\n", logs.err
    [audited] = api(files).get("/api/v1/audit", {"target": f"job:{job['id']}"})["entries"]
    assert audited["action"] == "job.run"
    assert audited["actor"] == {"kind": "schedule", "name": now}
    assert audited["details"]["created_by"] == done["created_by"]
    shown = cli("schedule", "show", now, "--json", env=env).json()
    assert [r["id"] for r in shown["runs"]] == [job["id"]]
    assert shown["paused"] is False and shown["temporal"]["actions"] == 1
    assert len(shown["next_times"]) == 5  # the next five first of Januaries
    assert "succeeded" in cli("schedule", "show", now, env=env).out

    # skip: a run due while the last one runs starts nothing.
    long = create(cli, env, "--cron", NEVER, "--overlap", "skip", "--", "sleep", "6")
    assert cli("schedule", "trigger", long, env=env).code == 0
    wait_for("the long run's job", lambda: jobs_of(cli, env, long), RUN_BOUND)
    time.sleep(1)
    assert cli("schedule", "trigger", long, env=env).code == 0
    assert cli("schedule", "trigger", long, env=env).code == 0
    wait_for("the long run's end", lambda: ended(jobs_of(cli, env, long)), RUN_BOUND)
    assert len(jobs_of(cli, env, long)) == 1
    skipped = cli("schedule", "show", long, "--json", env=env).json()["temporal"]
    assert skipped["skipped_overlap"] >= 1, skipped
    assert cli("schedule", "trigger", long, env=env).code == 0  # nothing runs now: it starts
    wait_for("a second run", lambda: len(jobs_of(cli, env, long)) == 2, RUN_BOUND)
    wait_for("the second run's end", lambda: ended(jobs_of(cli, env, long)), RUN_BOUND)
    assert overlapping(files, jobs_of(cli, env, long)) == []

    # Pause stops runs; unpause resumes them.
    often = create(cli, env, "--every", "2s", "--", "true")
    wait_for("two runs", lambda: len(jobs_of(cli, env, often)) >= 2, RUN_BOUND)
    assert cli("schedule", "pause", often, env=env).code == 0
    paused = cli("schedule", "show", often, "--json", env=env).json()
    assert paused["paused"] is True and paused["next_times"] == []
    assert "paused" in cli("schedule", "list", env=env).out
    time.sleep(3)  # a run that was starting as it paused has made its job by now
    before = len(jobs_of(cli, env, often))
    time.sleep(6)
    assert len(jobs_of(cli, env, often)) == before, "a paused schedule ran"
    assert cli("schedule", "unpause", often, env=env).code == 0
    wait_for("runs after unpause", lambda: len(jobs_of(cli, env, often)) >= before + 2, RUN_BOUND)
    assert cli("schedule", "delete", often, env=env).code == 0
    time.sleep(3)
    gone = len(jobs_of(cli, env, often))
    time.sleep(5)
    assert len(jobs_of(cli, env, often)) == gone, "a deleted schedule ran"
    assert cli("schedule", "show", often, env=env).code != 0

    # Another tenant's operator sees none of it, and cannot touch it.
    assert cli("tenant", "create", "acme", env=env).code == 0
    bob = operator_certs.issue(files, "bob", tmp_path / "bob", SERVER, role="operator",
                               tenants=("acme",))  # fmt: skip
    bob_env = {**env, "OZ0_CONTEXT": str(bob.directory / "context.json")}
    assert cli("schedule", "list", "--json", env=bob_env).json() == []
    for verb in ("show", "trigger", "pause", "delete"):
        refused = cli("schedule", verb, now, env=bob_env)
        assert refused.code != 0 and f"schedule {now} not found" in refused.err, refused
    assert jobs_of(cli, bob_env, now) == []
    made = cli("schedule", "create", "--cron", NEVER, "--tenant", "default", "--", "true",
               env=bob_env)  # fmt: skip
    assert made.code != 0 and "may not create schedules in tenant default" in made.err
    theirs = create(cli, bob_env, "--cron", NEVER, "--tenant", "acme", "--", "true")
    assert [s["id"] for s in cli("schedule", "list", "--json", env=bob_env).json()] == [theirs]

    # The web UI's Schedules page: the same, for bob's web account.
    cookie, csrf = web_account(files, "bob")
    status, page, _ = web(files, "GET", "/schedules", cookie)
    assert status == 200 and theirs in page and now not in page
    assert web(files, "POST", f"/schedules/{theirs}/pause", cookie, {"csrf": csrf})[0] == 303
    assert cli("schedule", "show", theirs, "--json", env=bob_env).json()["paused"] is True
    assert web(files, "POST", f"/schedules/{now}/trigger", cookie, {"csrf": csrf})[0] == 404
    assert web(files, "POST", f"/schedules/{theirs}/trigger", cookie, {})[0] == 403  # no CSRF
    made_on_web = {"csrf": csrf, "when": "every", "every": "1h", "command": "true",
                   "tenant": "acme"}  # fmt: skip
    assert web(files, "POST", "/schedules", cookie, made_on_web)[0] == 303
    assert len(cli("schedule", "list", "--json", env=bob_env).json()) == 2
    status, page, _ = web(files, "POST", "/schedules", cookie, {**made_on_web, "every": "soon"})
    assert status == 400 and "Every: invalid duration" in page

    # A bad cron expression or time zone: one line, nothing made.
    bad_specs: list[tuple[tuple[str, ...], str]] = [
        (("--cron", "61 * * * *"), "'61 * * * *' (UTC): Invalid schedule spec: Minute is not"),
        (("--cron", "every day"), "invalid cron expression"),
        (("--cron", "0 3 * * *", "--timezone", "Mars/Olympus"), "unknown time zone"),
        (("--every", "5s", "--cron", "* * * * *"), "--cron EXPR or --every"),
    ]
    for args, says in bad_specs:
        bad = cli("schedule", "create", *args, "--", "true", env=env)
        assert bad.code != 0 and says in bad.err, (args, bad)
        assert len(bad.err.strip().splitlines()) == 1, bad.err
    assert len(cli("schedule", "list", "--json", env=env).json()) == 4


@pytest.mark.slow
def test_a_cron_of_every_minute_starts_a_job_just_after_the_minute(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    start_server(files, SERVER)
    join_agents(cli, files, tmp_path, agents, [{}], edges=[EDGE])
    every_minute = create(cli, env, "--cron", "* * * * *", "--timezone", "Europe/Paris",
                          "--", "true")  # fmt: skip
    [job] = wait_for("a run", lambda: jobs_of(cli, env, every_minute), 60 + CRON_BOUND, 0.1)
    created = dt.datetime.fromisoformat(job["created_at"])
    late = created - created.replace(second=0, microsecond=0)
    assert late.total_seconds() < CRON_BOUND, job
    wait_for("its end", lambda: ended(jobs_of(cli, env, every_minute)), RUN_BOUND)
    assert jobs_of(cli, env, every_minute)[0]["state"] == "succeeded"
    print(f"the minute's run made its job {late.total_seconds():.3f} s after the minute")


@pytest.mark.slow
def test_a_killed_server_does_not_stop_a_schedule(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    tmp_path: Path,
    agents: list[AgentProcess],
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    servers = {SERVER: start_server(files, SERVER), SECOND: start_server(files, SECOND)}
    context = json.loads(files.context_path.read_text())
    context["servers"] = [f"{address}:8443" for address in servers]
    files.context_path.write_text(json.dumps(context))
    join_agents(cli, files, tmp_path, agents, [{}], edges=[EDGE])
    often = create(cli, env, "--every", "2s", "--", "true")
    wait_for("a first run", lambda: jobs_of(cli, env, often), RUN_BOUND)

    servers[SERVER].stop(signal.SIGKILL)
    killed = dt.datetime.now(dt.UTC)
    began = time.monotonic()
    wait_for(
        "two runs made after the kill",
        lambda: sum(
            dt.datetime.fromisoformat(j["created_at"]) > killed
            and j["state"] == "succeeded"
            for j in jobs_of(cli, env, often)
        ) >= 2,
        90,
        0.5,
    )  # fmt: skip
    took = time.monotonic() - began
    assert cli("schedule", "delete", often, env=env).code == 0
    print(f"two runs succeeded {took:.1f} s after a server was killed")
