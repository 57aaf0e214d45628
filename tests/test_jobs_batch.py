"""Rolling batches, `job run --all --batch N|P% [--batch-wait D] [--max-failures N|P%]`:
the spec's rules, then one real server (127.0.0.249) and five real agents.

What the cluster does is read from the attempts' start and end times, as the database
records them: never more parts at once than the batch, the next part started as soon as
one ends (a sliding window, not batches that wait for their slowest), the pause of
--batch-wait between an end and the next start, no part started after the failures
allowed, and a part whose node was blocked while it waited ended unrun.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.worker import Replayer
from werkzeug.datastructures import MultiDict

from fixtures.agent import joined_fleet
from fixtures.cluster import ClusterFiles, Served
from fixtures.job_calls import wait_job
from fixtures.temporal import run_async, server_credentials
from fixtures.web_events import curl, signed_in
from oz0.jobs.spec import JobError, JobSpec
from oz0.jobs.spec_text import describe_batch, parse_batch, parse_batch_wait, parse_max_failures
from oz0.jobs.worker_loop import BUILD_ID
from oz0.jobs.workflow import JobWorkflow, share_of
from oz0.web import job_pages
from tests.conftest import CliRunner

SERVER = "127.0.0.249"
ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)
EDGE = f"{SERVER}:7443"
# Generous for a loaded 2-core machine: a part of `true` takes well under a second.
JOB_BOUND = 60.0

# --- the spec ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "kept"), [("2", "2"), ("02", "2"), ("25%", "25%"), ("100%", "100%"), (" 1 ", "1")]
)
def test_a_batch_is_a_number_of_nodes_or_a_percentage(text: str, kept: str) -> None:
    assert parse_batch(text) == kept


@pytest.mark.parametrize("text", ["0", "0%", "101%", "-1", "2.5", "1e3", "x", "", "%", "1000000"])
def test_bad_batches_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid batch"):
        parse_batch(text)


def test_max_failures_may_be_0_and_a_batch_wait_0_or_a_duration_up_to_a_day() -> None:
    assert parse_max_failures("0") == "0" and parse_max_failures("10%") == "10%"
    assert parse_batch_wait("0") == 0.0 and parse_batch_wait("1m30s") == 90.0
    for bad in ("-1", "101%"):
        with pytest.raises(ValueError, match="invalid max-failures"):
            parse_max_failures(bad)
    with pytest.raises(ValueError, match="at most 1d"):
        parse_batch_wait("2d")


@pytest.mark.parametrize(
    ("share", "total", "least", "count"),
    [
        ("2", 5, 1, 2),
        ("10", 5, 1, 10),  # more lanes than parts: the workflow starts only as many as parts
        ("50%", 5, 1, 2),  # rounded down, as Salt's --batch 50%
        ("10%", 5, 1, 1),  # at least one
        ("10%", 5, 0, 0),  # failures: none allowed
        ("100%", 7, 1, 7),
        ("0", 7, 0, 0),
    ],
)
def test_a_share_counts_once_the_nodes_are_known(
    share: str, total: int, least: int, count: int
) -> None:
    assert share_of(share, total, least=least) == count


def test_a_job_keeps_its_batch() -> None:
    spec = JobSpec.from_json(
        {"command": ["true"], "all": True, "batch": 2, "batch_wait": 1.5, "max_failures": "10%"}
    )
    assert (spec.batch, spec.batch_wait, spec.max_failures) == ("2", 1.5, "10%")
    plain = JobSpec.from_json({"command": ["true"], "all": True})
    assert (plain.batch, plain.batch_wait, plain.max_failures) == (None, 0.0, None)
    assert describe_batch("2", 1.5, "10%") == (
        "2 at a time, 1.5 s between, no new part once more than 10% failed"
    )
    assert describe_batch("25%", 0, None) == "25% of the nodes at a time"


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"batch": 2}, "batch goes with all"),
        ({"all": True, "batch": 0}, "invalid batch '0'"),
        ({"all": True, "batch": "150%"}, "invalid batch '150%'"),
        ({"all": True, "batch": True}, "batch must be a number of nodes or a percentage"),
        ({"all": True, "batch": 2.5}, "batch must be a number of nodes or a percentage"),
        ({"all": True, "batch_wait": 5}, "batch_wait goes with batch"),
        ({"all": True, "max_failures": 1}, "max_failures goes with batch"),
        ({"all": True, "batch": 2, "batch_wait": -1}, "batch_wait must be a number of seconds"),
        ({"all": True, "batch": 2, "batch_wait": "5s"}, "batch_wait must be a number of seconds"),
        ({"all": True, "batch": 2, "max_failures": -1}, "invalid max_failures '-1'"),
    ],
)
def test_bad_batch_fields_are_one_line_each(body: dict[str, Any], message: str) -> None:
    with pytest.raises(JobError, match=message) as refused:
        JobSpec.from_json({"command": ["true"], **body})
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    "args",
    [
        ["--batch", "2"],  # without --all
        ["--all", "--batch", "0"],
        ["--all", "--batch", "101%"],
        ["--all", "--batch", "two"],
        ["--all", "--max-failures", "1"],  # without --batch
        ["--all", "--batch-wait", "5s"],  # without --batch
        ["--all", "--batch", "2", "--batch-wait", "2x"],
        ["--all", "--batch", "2", "--max-failures", "5%%"],
    ],
)
def test_bad_batch_options_are_one_line_and_exit_2(cli: CliRunner, args: list[str]) -> None:
    result = cli("job", "run", *args, "--", "true")
    assert result.code == 2, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err


def test_the_run_form_takes_a_batch_and_refuses_one_without_all_nodes() -> None:
    form = MultiDict(
        {"command": "true", "all": "on", "batch": "25%", "batch_wait": "30s", "max_failures": "1"}
    )
    spec = job_pages.spec_from_form(form)
    assert (spec.batch, spec.batch_wait, spec.max_failures) == ("25%", 30.0, "1")
    with pytest.raises(JobError, match="batch goes with all"):
        job_pages.spec_from_form(MultiDict({"command": "true", "batch": "2"}))
    with pytest.raises(JobError, match="Batch: invalid batch"):
        job_pages.spec_from_form(MultiDict({"command": "true", "all": "on", "batch": "0"}))


# --- with real agents -------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    files: ClusterFiles
    # Sorted by ID, the order a batch takes its nodes in; group=x and group=y.
    nodes: list[str]
    x: list[str]
    y: list[str]

    @property
    def env(self) -> dict[str, str]:
        return self.files.cli_env


@pytest.fixture(scope="module")
def fleet(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Five agents of the module's server: three labelled group=x, two group=y."""
    groups = ["x", "x", "x", "y", "y"]
    root = tmp_path_factory.mktemp("batch-agents")
    with joined_fleet(served.files, EDGE, root, [{"group": g} for g in groups]) as agents:
        ids = [a.reported()["node_id"] for a in agents]
        of = {group: sorted(n for n, g in zip(ids, groups, strict=True) if g == group)
              for group in "xy"}  # fmt: skip
        yield Fleet(served.files, sorted(ids), of["x"], of["y"])


@dataclass(frozen=True)
class Span:
    number: int
    node: str
    started: dt.datetime
    ended: dt.datetime
    exit_code: int | None


def spans(job: dict[str, Any]) -> list[Span]:
    """The job's attempts as the database recorded them: placed (started) and ended."""
    return [
        Span(
            a["number"], a["node"], dt.datetime.fromisoformat(a["started_at"]),
            dt.datetime.fromisoformat(a["ended_at"]), a["exit_code"],
        )
        for a in job["attempts"]
    ]  # fmt: skip


def most_at_once(runs: list[Span]) -> int:
    """The most attempts running together at any moment (one that ends as another starts
    is not together with it)."""
    events = sorted([(s.started, 1) for s in runs] + [(s.ended, -1) for s in runs], key=lambda e: e)
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def replays(files: ClusterFiles, job_id: str) -> None:
    """The job's history, fetched from the server's Temporal, replays in a fresh worker of
    this release: the lanes and their timers decided the same steps (deterministic). Each
    step names the server's release as the build that decided it."""

    async def replay() -> None:
        client = await Client.connect(
            f"{SERVER}:7233", namespace="default", tls=server_credentials(files).tls()
        )
        history = await client.get_workflow_handle(job_id).fetch_history()
        builds = {
            e.workflow_task_completed_event_attributes.worker_version.build_id
            for e in history.events
            if e.HasField("workflow_task_completed_event_attributes")
        }
        assert builds == {BUILD_ID}, builds
        replayed = await Replayer(workflows=[JobWorkflow]).replay_workflow(history)
        assert replayed.replay_failure is None, replayed.replay_failure

    run_async(replay)


def detached(cli: CliRunner, fleet: Fleet, *args: str) -> str:
    ran = cli("job", "run", "--detach", "--json", *args, env=fleet.env)
    assert ran.code == 0, ran.err
    job_id: str = ran.json()["id"]
    return job_id


def ended(fleet: Fleet, job_id: str) -> dict[str, Any]:
    return wait_job(fleet.files, job_id, lambda j: j["ended_at"] is not None, JOB_BOUND)


@pytest.mark.slow
def test_batch_2_runs_at_most_2_at_once_and_starts_the_next_as_soon_as_one_ends(
    cli: CliRunner, fleet: Fleet
) -> None:
    """The first node's part is slow: in a sliding window the other lane goes on through
    the rest meanwhile, so the third part starts before the first ends."""
    slow = fleet.nodes[0]
    job_id = detached(
        cli, fleet, "--all", "--batch", "2", "--",
        "sh", "-c", f'if [ "$OZ0_NODE_ID" = {slow} ]; then sleep 5; else sleep 0.3; fi',
    )  # fmt: skip
    waiting = wait_job(
        fleet.files, job_id, lambda j: j["parts"]["running"] and j["parts"]["waiting"], 20
    )
    assert waiting["batch"] == {"size": "2", "wait": 0.0, "max_failures": None}
    assert waiting["parts"]["total"] == 5 and waiting["parts"]["running"] <= 2
    assert len(waiting["parts"]["waiting_nodes"]) == waiting["parts"]["waiting"]
    shown = cli("job", "show", job_id, env=fleet.env).out.splitlines()
    assert ["batch:", "2", "at", "a", "time"] in [line.split() for line in shown], shown
    assert any(line.split()[:2] == ["parts:", "5:"] and "waiting," in line for line in shown)

    done = ended(fleet, job_id)
    assert done["state"] == "succeeded", done
    runs = spans(done)
    assert sorted(s.node for s in runs) == fleet.nodes and {s.exit_code for s in runs} == {0}
    assert most_at_once(runs) == 2, runs
    by_node = {s.node: s for s in runs}
    assert by_node[fleet.nodes[2]].started < by_node[slow].ended, runs
    # The other lane's parts, one after another: how soon the next starts after an end.
    lane = sorted((s for s in runs if s.node != slow), key=lambda s: s.started)
    slide = [(b.started - a.ended).total_seconds() for a, b in itertools.pairwise(lane)]
    print(f"--batch 2: next part placed {', '.join(f'{g:.3f}' for g in slide)} s after an end")
    assert done["parts"] == {
        "total": 5, "waiting": 0, "running": 0, "ended": 5, "not_started": 0,
        "waiting_nodes": [],
    }  # fmt: skip
    replays(fleet.files, job_id)


@pytest.mark.slow
def test_batch_1_max_failures_0_stops_at_the_first_failure(cli: CliRunner, fleet: Fleet) -> None:
    bad = fleet.nodes[1]
    ran = cli(
        "job", "run", "--all", "--batch", "1", "--max-failures", "0", "--",
        "sh", "-c", f'test "$OZ0_NODE_ID" != {bad}', env=fleet.env,
    )  # fmt: skip
    assert ran.code == 1, ran
    assert "1 of 5 nodes failed; 3 parts not started (--max-failures 0)" in ran.err, ran.err
    [job] = cli("job", "list", "--limit", "1", "--json", env=fleet.env).json()
    assert job["state"] == "failed" and job["exit_code"] == 1
    # The parts after the failure never started: no attempt on their nodes, ever.
    assert [a["node"] for a in job["attempts"]] == fleet.nodes[:2]
    assert [a["exit_code"] for a in job["attempts"]] == [0, 1]
    assert job["parts"] == {
        "total": 5, "waiting": 0, "running": 0, "ended": 2, "not_started": 3,
        "waiting_nodes": [],
    }  # fmt: skip


@pytest.mark.slow
def test_batch_wait_rests_between_an_end_and_the_next_start(cli: CliRunner, fleet: Fleet) -> None:
    wait = 2.0
    job_id = detached(
        cli, fleet, "--selector", "group=x", "--all", "--batch", "1", "--batch-wait",
        f"{wait:g}s", "--", "true",
    )  # fmt: skip
    done = ended(fleet, job_id)
    assert done["state"] == "succeeded", done
    runs = sorted(spans(done), key=lambda s: s.started)
    assert [s.node for s in runs] == fleet.x
    gaps = [(b.started - a.ended).total_seconds() for a, b in itertools.pairwise(runs)]
    print(f"--batch-wait {wait:g}s: gaps between an end and the next start {gaps}")
    assert all(wait <= gap < wait + 10 for gap in gaps), gaps
    replays(fleet.files, job_id)


@pytest.mark.slow
def test_the_web_uis_run_form_runs_a_batch_and_its_page_shows_the_parts(
    fleet: Fleet, tmp_path: Path
) -> None:
    base, jar = f"https://{SERVER}:8443", tmp_path / "cookies"
    signed_in(SERVER, fleet.files.ui_password, jar)
    form = curl("-b", str(jar), f"{base}/jobs/new").stdout
    assert all(f'name="{field}"' in form for field in ("batch", "batch_wait", "max_failures"))
    csrf = re.search(r'name="csrf" value="([^"]+)"', form)
    assert csrf is not None, form
    posted = curl(
        "-b", str(jar), "-o", "/dev/null", "-w", "%{http_code} %{redirect_url}",
        "-H", f"Origin: {base}", "--data-urlencode", f"csrf={csrf[1]}",
        "--data-urlencode", "command=sleep 1", "--data-urlencode", "selector=group=x",
        "-d", "all=on", "-d", "batch=1", "-d", "batch_wait=1s", "-d", "max_failures=0",
        "-d", "tenant=default", "-d", "retries=0", f"{base}/jobs",
    ).stdout.split()  # fmt: skip
    assert posted[0] == "303", posted
    job_id = posted[1].rsplit("/", 1)[1].split("?")[0]
    wait_job(fleet.files, job_id, lambda j: j["parts"]["running"] == 1, 20)
    page = curl("-b", str(jar), f"{base}/jobs/{job_id}").stdout
    assert "1 at a time, 1 s between, no new part once more than 0 failed" in page, page
    assert re.search(r'data-field="parts">3: [0-2] waiting, 1 running', page), page
    live = json.loads(curl("-b", str(jar), f"{base}/jobs/{job_id}/live.json").stdout)
    assert live["parts"].startswith("3: ") and "not started" in live["parts"], live
    done = ended(fleet, job_id)
    assert done["state"] == "succeeded" and done["created_by"] == "ui:admin", done
    assert done["batch"] == {"size": "1", "wait": 1.0, "max_failures": "0"}
    assert most_at_once(spans(done)) == 1


@pytest.mark.slow
def test_a_part_whose_node_is_blocked_while_it_waits_ends_lost_without_running(
    cli: CliRunner, fleet: Fleet
) -> None:
    """Last of the file: it blocks a node of the module's fleet."""
    first, blocked = fleet.y
    job_id = detached(
        cli, fleet, "--selector", "group=y", "--all", "--batch", "1", "--", "sleep", "3"
    )
    wait_job(fleet.files, job_id, lambda j: j["parts"]["running"] == 1, 20)
    assert cli("node", "block", blocked, "--reason", "batch test", env=fleet.env).code == 0
    done = ended(fleet, job_id)
    assert done["state"] == "lost", done
    assert done["reason"] == "1 of 2 nodes were lost (node blocked)"
    assert [(a["node"], a["exit_code"]) for a in done["attempts"]] == [(first, 0)]
    assert done["parts"]["not_started"] == 1 and done["parts"]["ended"] == 1
    text = cli("job", "show", job_id, env=fleet.env).out
    assert "1 not started" in text, text
