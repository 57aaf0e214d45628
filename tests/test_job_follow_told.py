"""A job's follower is told, not polling (127.0.0.248): GET /api/v1/jobs/<id>/output with
`wait` answers as the job's output is committed or the job ends (oz0/jobs/follow.py, woken
by the jobs' pg_notify on `oz0_jobs`), so `job run` exits soon after its job's end; a
draining server answers its long polls at once.

Real server, real Temporal, a real agent. The bounds are generous for a loaded 2-core
machine but far below the wait asked: a follower that was not told would answer only when
its wait ran out.
"""

from __future__ import annotations

import base64
import datetime as dt
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cli.client import ApiClient, ApiError
from fixtures.agent import AgentProcess, join_agents
from fixtures.cluster import ClusterFiles, StartServer
from fixtures.job_calls import api, wait_job
from oz0.server.start import SHUTDOWN_GRACE
from tests.conftest import CliRunner

SERVER = "127.0.0.248"
ADVERTISE = SERVER  # the suite's cluster_files (tests/conftest.py)
EDGE = f"{SERVER}:7443"
# What each long poll asks for: far past every bound below.
WAIT = 20
# From a job's end (or its output's commit) to the answer of a long poll that waits for it.
TOLD_BOUND = 1.0
# A read deadline past the wait asked, as the CLI gives its long polls.
READ_DEADLINE = WAIT + 15.0


def output_told(client: ApiClient, job_id: str, after: int, seen: str | None) -> dict[str, Any]:
    page: dict[str, Any] = client.get(
        f"/api/v1/jobs/{job_id}/output",
        {"after": after, "wait": WAIT, "seen": seen},
        read_timeout=READ_DEADLINE,
    )
    return page


def since_end(job: dict[str, Any]) -> float:
    """Seconds from the job's end as the database recorded it to now (the database runs on
    this machine: one clock)."""
    ended_at = dt.datetime.fromisoformat(job["ended_at"])
    return (dt.datetime.now(dt.UTC) - ended_at).total_seconds()


@pytest.mark.slow
def test_followers_are_told_of_output_and_of_the_end_as_they_happen(
    cli: CliRunner,
    cluster_files: ClusterFiles,
    start_server: StartServer,
    agents: list[AgentProcess],
    tmp_path: Path,
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    start_server(files, SERVER)
    join_agents(cli, files, tmp_path, agents, [{"role": "web"}], edges=[EDGE])

    # `job run` follows the job to its end and exits soon after it.
    ran = cli("job", "run", "--", "sh", "-c", "sleep 1; echo x", env=env)
    exited = dt.datetime.now(dt.UTC)
    assert (ran.code, ran.out) == (0, "x\n"), ran.err
    [job] = api(files).get("/api/v1/jobs")["jobs"]
    ended_at = dt.datetime.fromisoformat(job["ended_at"])
    after_end = (exited - ended_at).total_seconds()
    print(f"job run exited {after_end:.3f} s after its job's end")
    assert after_end < TOLD_BOUND, f"job run exited {after_end:.2f} s after its job's end"

    # A long poll is answered when output is committed, then when the job ends.
    client = api(files)
    started = cli(
        "job", "run", "--detach", "--json", "--", "sh", "-c", "sleep 2; echo a; sleep 2",
        env=env,
    )  # fmt: skip
    assert started.code == 0, started.err
    job_id = started.json()["id"]
    running = wait_job(files, job_id, lambda j: j["state"] == "running", 30)
    assert running["ended_at"] is None
    first = client.get(f"/api/v1/jobs/{job_id}/output")  # no wait: at once, its version
    assert first["chunks"] == [] and first["waited"] is False and first["version"]

    asked = time.monotonic()
    told = output_told(client, job_id, first["cursor"], first["version"])
    waited = time.monotonic() - asked
    assert told["waited"] is True
    assert [base64.b64decode(c["data"]) for c in told["chunks"]] == [b"a\n"], told
    assert not told["ended"]
    # It waited for the output (about 2 s from the start), not for its wait to run out.
    print(f"long poll answered with output after {waited:.2f} s")
    assert waited < 2 + TOLD_BOUND + 2, waited

    version = told["version"]
    while True:  # an attempt's changes may wake it before the end: each a new version
        told = output_told(client, job_id, told["cursor"], version)
        assert told["waited"] is True
        if told["ended"]:
            break
        assert told["version"] != version, "woken with nothing new"
        version = told["version"]
    late = since_end(told["job"])
    print(f"long poll answered {late:.3f} s after the job's end")
    assert late < TOLD_BOUND, f"told of the end {late:.2f} s after it"
    assert told["job"]["state"] == "succeeded" and told["chunks"] == []

    # An ended job's long poll is answered at once, whatever version it names.
    asked = time.monotonic()
    again = output_told(client, job_id, told["cursor"], "0123456789abcdef")
    assert time.monotonic() - asked < TOLD_BOUND
    assert again["ended"] and again["chunks"] == []

    # A wait outside 0..20 is refused in one line.
    with pytest.raises(ApiError) as refused:
        client.get(f"/api/v1/jobs/{job_id}/output", {"wait": WAIT + 1})
    assert str(refused.value) == f"wait must be between 0 and {WAIT}"
    with pytest.raises(ApiError) as refused:
        client.get(f"/api/v1/jobs/{job_id}/output", {"wait": "soon"})
    assert str(refused.value) == "wait must be a whole number"


@pytest.mark.slow
def test_a_long_poll_in_flight_when_the_server_drains_is_answered_at_once(
    cli: CliRunner, cluster_files: ClusterFiles, start_server: StartServer
) -> None:
    files, env = cluster_files, cluster_files.cli_env
    server = start_server(files, SERVER)
    # No node matches: the job waits, queued, and its long poll with it.
    queued = cli(
        "job", "run", "--selector", "role=none", "--detach", "--json", "--", "true", env=env
    )
    assert queued.code == 0, queued.err
    job_id = queued.json()["id"]
    wait_job(files, job_id, lambda j: j["reason"] is not None, 30)
    client = api(files)
    first = client.get(f"/api/v1/jobs/{job_id}/output")
    answers: list[dict[str, Any]] = []
    poll = threading.Thread(
        target=lambda: answers.append(output_told(client, job_id, 0, first["version"]))
    )
    poll.start()
    time.sleep(1.0)  # the long poll is in flight, waiting (it would for WAIT s)
    assert not answers

    signalled = time.monotonic()
    server.process.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
    poll.join(timeout=WAIT + 15)
    answered = time.monotonic() - signalled
    print(f"the long poll was answered {answered:.2f} s after SIGTERM")
    assert answers, "no answer"
    [answer] = answers
    # Answered with what it had, saying it did not wait (the CLI rests before asking again).
    assert answer["waited"] is False and answer["job"]["state"] == "queued"
    assert answered < TOLD_BOUND, f"answered {answered:.2f} s after SIGTERM"
    assert server.wait(SHUTDOWN_GRACE + 6) == 0
    assert "0 request(s) and 0 stream(s) cut" in server.stderr()
