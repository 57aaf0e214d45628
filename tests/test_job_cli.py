"""`orchestrator-zero job ...` without a server: what the command line means (durations,
KEY=VALUE pairs, the `--` before the command, the body `job run` sends), and the follow
loop fed recorded output pages (bytes as sent, exit codes, the line for a job that ended
another way, headers when the attempt changes, Ctrl-C). The end-to-end tests with real
servers and agents are in the jobs tests."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cli import job_cmds
from cli.job_follow import Follower, outcome
from cli.job_params import parse_cpu, parse_duration, parse_env, parse_selector, parse_size
from oz0.jobs import spec_text
from oz0.jobs import workflow as wf
from oz0.jobs.spec import JobError, JobSpec
from tests.conftest import CliRunner

JOB = "job-0123456789ab"
NODE_A = "node-00000000000a"
NODE_B = "node-00000000000b"


# --- durations and KEY=VALUE -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90.0), ("90s", 90.0), ("1.5s", 1.5), ("0.5", 0.5), ("5m", 300.0), ("1h", 3600.0),
     ("1h30m", 5400.0), ("1h30m15s", 5415.0), ("2d", 172800.0), (" 10m ", 600.0)],
)  # fmt: skip
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "0s", "abc", "1h3", "5x", "-5", "m", "30m1h", "1e3"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


def test_a_bad_duration_is_one_line_and_exit_2(cli: CliRunner) -> None:
    result = cli("job", "run", "--timeout", "1h3", "--", "true")
    assert result.code == 2
    assert result.err.count("\n") == 1
    assert "--timeout" in result.err and "invalid duration '1h3'" in result.err
    result = cli("job", "run", "--queue-timeout", "0", "--", "true")
    assert result.code == 2 and "longer than 0s" in result.err


def test_selectors_follow_the_node_label_rules() -> None:
    assert parse_selector(["role=web", "zone=eu/1", "empty="]) == {
        "role": "web",
        "zone": "eu/1",
        "empty": "",
    }
    assert parse_selector(["k=a=b"]) == {"k": "a=b"}
    for bad, message in [
        ("Role=web", "invalid label key 'Role'"),
        ("-x=1", "invalid label key '-x'"),
        ("role", "use KEY=VALUE"),
        ("=web", "use KEY=VALUE"),
        ("role=\x1b[2J", "invalid value for label role"),
        ("role=" + "v" * 254, "invalid value for label role"),
    ]:
        with pytest.raises(ValueError, match="invalid selector") as caught:
            parse_selector([bad])
        assert message in str(caught.value)
    with pytest.raises(ValueError, match="more than once"):
        parse_selector(["role=web", "role=db"])


def test_env_pairs() -> None:
    assert parse_env(["LANG=C", "_X1=a=b", "EMPTY="]) == {"LANG": "C", "_X1": "a=b", "EMPTY": ""}
    for bad, message in [
        ("1X=a", "a name is letters"),
        ("A-B=a", "a name is letters"),
        ("NOEQUALS", "use KEY=VALUE"),
        ("OZ0_JOB_ID=x", "the node sets OZ0_JOB_ID itself"),
        ("A=x\0y", "NUL"),
    ]:
        with pytest.raises(ValueError, match="invalid env") as caught:
            parse_env([bad])
        assert message in str(caught.value)
    with pytest.raises(ValueError, match="more than once"):
        parse_env(["A=1", "A=2"])


@pytest.mark.parametrize(
    "args",
    [
        ["--selector", "Role=web"],
        ["--selector", "role"],
        ["--env", "1X=a"],
        ["--node", "node-1"],
        ["--node", NODE_A, "--all"],
        ["--retries", "-1"],
        ["--retries", "many"],
        ["--json", "--output", "prefixed"],  # --json prints the recap only
        ["--detach", "--output", "grouped"],  # how a followed job shows
        ["--detach", "--progress"],
        ["--output", "columns"],
    ],
)
def test_bad_job_run_options_are_one_line_and_exit_2(cli: CliRunner, args: list[str]) -> None:
    result = cli("job", "run", *args, "--", "true")
    assert result.code == 2, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1


@pytest.mark.parametrize(
    ("text", "size"),
    [("512M", 512 << 20), ("2G", 2 << 30), ("1.5GiB", 3 << 29), ("64MB", 64 << 20),
     ("4194304", 4 << 20), ("1t", 1 << 40), (" 8 mib ", 8 << 20), ("4096K", 4 << 20)],
)  # fmt: skip
def test_sizes_are_bytes_or_a_number_with_a_power_of_1024(text: str, size: int) -> None:
    assert parse_size(text) == size


@pytest.mark.parametrize(
    ("text", "message"),
    [("", "use bytes or a number with K"), ("abc", "use bytes or a number with K"),
     ("-1G", "use bytes or a number with K"), ("1e9", "use bytes or a number with K"),
     ("2X", "use bytes or a number with K"), ("3M", "at least 4 MiB"),
     ("4000000", "at least 4 MiB"), ("2P", "at most 1 PiB")],
)  # fmt: skip
def test_bad_sizes_are_refused_saying_what_a_size_is(text: str, message: str) -> None:
    with pytest.raises(ValueError, match="invalid size") as caught:
        parse_size(text)
    assert message in str(caught.value)


def test_cpu_is_a_number_of_cpus() -> None:
    assert parse_cpu("0.5") == 0.5 and parse_cpu("2") == 2.0 and parse_cpu("0.01") == 0.01
    for bad in ("0", "0.001", "-1", "half", "nan", "inf", "1025"):
        with pytest.raises(ValueError, match=r"invalid cpu .*from 0\.01 to 1024"):
            parse_cpu(bad)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory", "lots"], "invalid size 'lots'"),
        (["--memory", "1M"], "at least 4 MiB"),
        (["--max-address-space", "1k"], "at least 4 MiB"),
        (["--cpu", "0"], "from 0.01 to 1024"),
        (["--max-processes", "0"], "--max-processes: max processes must be a whole number"),
        (["--max-open-files", "8"], "--max-open-files: max open files must be a whole number"),
        (["--max-open-files", "many"], "--max-open-files"),
    ],
)
def test_bad_limits_are_one_line_exit_2_and_send_nothing(
    cli: CliRunner, api: RecordingApi, args: list[str], message: str
) -> None:
    result = cli("job", "run", *args, "--", "true")
    assert result.code == 2, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1
    assert message in result.err
    assert api.posts == []


def test_bad_job_ids_are_refused_before_any_request(cli: CliRunner) -> None:
    # No context exists here: reaching the network would fail differently (exit 1).
    for args in (["show", "job-1"], ["logs", "x"], ["cancel", "JOB-0123456789AB"]):
        result = cli("job", *args)
        assert result.code == 2, result
        assert "invalid job ID" in result.err


# --- what `job run` sends -------------------------------------------------------------------


class RecordingApi:
    """Stands in for the API client: records the POST, answers GETs from recorded pages."""

    def __init__(self, pages: list[Any] | None = None) -> None:
        self.posts: list[tuple[str, dict[str, Any]]] = []
        self.gets: list[tuple[str, dict[str, Any] | None]] = []
        self.read_timeouts: list[float] = []
        self.pages: list[Any] = list(pages or [])  # a page, or an exception to raise

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.posts.append((path, body))
        return job_object(state="queued")

    def get(
        self, path: str, query: dict[str, Any] | None = None, *, read_timeout: float = 15.0
    ) -> dict[str, Any]:
        self.gets.append((path, query))
        self.read_timeouts.append(read_timeout)
        item = self.pages.pop(0)
        if isinstance(item, BaseException):
            raise item
        answer: dict[str, Any] = item
        return answer


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> Iterator[RecordingApi]:
    recording = RecordingApi()
    monkeypatch.setattr(job_cmds, "select", lambda context: None)
    monkeypatch.setattr(job_cmds, "ApiClient", lambda context: recording)
    yield recording


def test_the_command_is_everything_after_the_double_dash(cli: CliRunner, api: RecordingApi) -> None:
    result = cli(
        "job", "run", "--selector", "role=web", "--selector", "zone=eu", "--timeout", "1m30s",
        "--env", "LANG=C", "--retries", "2", "--name", "list it", "--no-move",
        "--queue-timeout", "5m", "--detach", "--", "ls", "-la", "--all", "--", "--detach", "-h",
    )  # fmt: skip
    assert result.code == 0, result
    assert result.out == f"{JOB}\n"
    [(path, body)] = api.posts
    assert path == "/api/v1/jobs"
    assert body == {
        "tenant": "default",
        "command": ["ls", "-la", "--all", "--", "--detach", "-h"],
        "selector": {"role": "web", "zone": "eu"},
        "node": None,
        "all": False,
        "timeout": 90.0,
        "retries": 2,
        "env": {"LANG": "C"},
        "name": "list it",
        "no_move": True,
        "queue_timeout": 300.0,
    }


def test_defaults_of_job_run(cli: CliRunner, api: RecordingApi) -> None:
    result = cli("job", "run", "--detach", "--json", "--node", NODE_A, "--", "uptime")
    assert result.code == 0, result
    assert result.json()["id"] == JOB
    [(_, body)] = api.posts
    assert body["command"] == ["uptime"]
    assert body["node"] == NODE_A
    assert body["tenant"] == "default" and body["selector"] == {} and body["env"] == {}
    assert body["timeout"] is None and body["retries"] == 0 and body["queue_timeout"] == 600.0
    assert body["all"] is False and body["no_move"] is False and body["name"] is None


def test_limits_are_sent_in_bytes_and_cpus_and_only_those_asked(
    cli: CliRunner, api: RecordingApi
) -> None:
    result = cli(
        "job", "run", "--memory", "512M", "--cpu", "0.5", "--max-processes", "100",
        "--max-open-files", "1024", "--max-address-space", "1.5G", "--detach", "--", "true",
    )  # fmt: skip
    assert result.code == 0, result
    assert cli("job", "run", "--max-open-files", "64", "--detach", "--", "true").code == 0
    assert cli("job", "run", "--detach", "--", "true").code == 0
    [(_, every), (_, one), (_, none)] = api.posts
    assert every["limits"] == {
        "memory": 512 << 20,
        "cpu": 0.5,
        "max_processes": 100,
        "max_open_files": 1024,
        "address_space": 3 << 29,
    }
    assert one["limits"] == {"max_open_files": 64}
    assert "limits" not in none  # a server without limits would refuse the field


@pytest.mark.parametrize(
    "args",
    [
        ["ls"],  # no --
        ["rm", "--all"],  # without -- this would be rm on every node
        ["--all", "ls"],
        [],
        ["--"],
    ],
)
def test_job_run_needs_its_command_after_a_double_dash(
    cli: CliRunner, api: RecordingApi, args: list[str]
) -> None:
    result = cli("job", "run", *args)
    assert result.code == 2, result
    assert "job run needs" in result.err and " -- " in result.err
    assert api.posts == []


# --- the follow loop, fed recorded pages ------------------------------------------------------


def job_object(
    *, state: str = "running", exit_code: int | None = None, reason: str | None = None,
    attempts: list[dict[str, Any]] | None = None, all_nodes: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        "id": JOB, "name": None, "tenant": "default", "state": state, "reason": reason,
        "command": ["sh", "-c", "x"], "selector": {}, "node": None, "all": all_nodes,
        "retries": 0, "timeout": None, "queue_timeout": 600.0, "no_move": False, "env": [],
        "exit_code": exit_code, "created_at": "2026-12-01T11:00:00+00:00",
        "started_at": None, "ended_at": None, "created_by": "operator:admin",
        "attempts": attempts or [],
    }  # fmt: skip


def attempt_row(
    number: int, node: str, *, ended_because: str | None = None, exit_code: int | None = None
) -> dict[str, Any]:
    return {
        "number": number, "node": node, "state": "ended" if ended_because else "running",
        "started_at": "2026-12-01T11:00:01+00:00", "ended_at": None, "exit_code": exit_code,
        "ended_because": ended_because, "output_bytes": 0, "truncated": False,
    }  # fmt: skip


def chunk(
    cursor: int, data: bytes, *, number: int = 1, node: str = NODE_A, stream: str = "stdout",
    truncated: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        "cursor": cursor, "attempt": number, "node": node, "stream": stream,
        "data": base64.b64encode(data).decode(), "truncated": truncated,
    }  # fmt: skip


def page(
    chunks: list[dict[str, Any]], job: dict[str, Any], *, after: int = 0, **told: Any
) -> dict[str, Any]:
    """An output page; TOLD: what a server that takes `wait` adds (version, waited)."""
    cursor = chunks[-1]["cursor"] if chunks else after
    return {"chunks": chunks, "cursor": cursor, "ended": job["state"] in ENDED, "job": job, **told}


ENDED = ("succeeded", "failed", "cancelled", "lost")


class Recorded:
    """Hands out PAGES in turn and records the cursor each fetch asked after, and the wait
    and version seen it passed."""

    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = list(pages)
        self.asked: list[int] = []
        self.waits: list[tuple[int, str | None]] = []

    def __call__(self, after: int, wait: int, seen: str | None) -> dict[str, Any]:
        self.asked.append(after)
        self.waits.append((wait, seen))
        return self.pages.pop(0)


def follow(
    pages: list[dict[str, Any]], *, headers: str = "moves", keep_following: bool = True
) -> tuple[dict[str, Any], bytes, bytes, Recorded, list[float]]:
    fetch = Recorded(pages)
    out, err = io.BytesIO(), io.BytesIO()
    slept: list[float] = []
    follower = Follower(fetch, out, err, headers=headers, sleep=slept.append)
    job = follower.run(follow=keep_following)
    assert fetch.pages == [], "the loop stopped before the output was complete"
    return job, out.getvalue(), err.getvalue(), fetch, slept


def test_output_is_written_byte_for_byte_until_the_job_ends() -> None:
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    done = job_object(
        state="succeeded", exit_code=0, attempts=[attempt_row(1, NODE_A, ended_because="exit")]
    )
    binary = bytes(range(256)) + b"\x1b[2J not utf-8: \xff\xfe"
    job, out, err, fetch, slept = follow(
        [
            page([], running),
            page([chunk(3, b"hello "), chunk(4, b"oops\n", stream="stderr")], running),
            page([chunk(9, binary)], running, after=4),
            page([], running, after=9),
            page([chunk(10, b"bye\n")], done, after=9),
            page([], done, after=10),  # ended and empty: complete
        ]
    )
    assert out == b"hello " + binary + b"bye\n"
    assert err == b"oops\n"  # nothing of ours: no header for the only attempt
    assert fetch.asked == [0, 0, 4, 9, 9, 10]
    assert slept == [0.3, 0.3]  # only after pages with nothing new
    # A server that says nothing of versions (older than `wait`) is never asked to wait.
    assert {wait for wait, _ in fetch.waits} == {0}
    assert outcome(job) == (0, None)


def test_a_told_follower_asks_the_server_to_wait_and_never_sleeps_after_a_wait() -> None:
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    done = job_object(
        state="succeeded", exit_code=0, attempts=[attempt_row(1, NODE_A, ended_because="exit")]
    )
    job, out, _, fetch, slept = follow(
        [
            page([], running, version="v1", waited=False),  # asked without a wait
            page([], running, version="v1", waited=True),  # the wait ran out: nothing new
            page([chunk(3, b"x\n")], running, version="v2", waited=True),
            page([], done, after=3, version="v3", waited=True),  # woken by the end
        ]
    )
    assert out == b"x\n"
    # The first fetch answers at once (nothing shown yet); then each waits for news since
    # the version the last page gave.
    assert fetch.waits == [(0, None), (10, "v1"), (10, "v1"), (10, "v2")]
    assert slept == []
    assert outcome(job) == (0, None)


def test_a_server_that_did_not_wait_is_asked_again_after_the_poll_interval() -> None:
    # A stopping server answers a long poll at once without waiting: the follower sleeps
    # rather than ask it again and again.
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    done = job_object(state="succeeded", exit_code=0)
    _, _, _, fetch, slept = follow(
        [
            page([], running, version="v1", waited=False),
            page([], running, version="v1", waited=False),
            page([], done, version="v2", waited=False),
        ]
    )
    assert fetch.waits == [(0, None), (10, "v1"), (10, "v1")]
    assert slept == [0.3]  # after the second: the first, asked at once, had no wait to do


def test_the_command_exit_code_is_the_exit_code() -> None:
    assert outcome(job_object(state="failed", exit_code=3)) == (3, None)
    assert outcome(job_object(state="succeeded", exit_code=0)) == (0, None)
    assert outcome(job_object(state="failed", exit_code=137)) == (137, None)
    # --all: the job's exit_code field
    assert outcome(job_object(state="failed", exit_code=2, all_nodes=True)) == (2, None)


@pytest.mark.parametrize(
    ("state", "reason", "attempts", "shown"),
    [
        ("lost", "node blocked and the job may not move (--no-move)", [], "lost: node blocked"),
        ("cancelled", None, [attempt_row(1, NODE_A, ended_because="cancelled")],
         "cancelled: cancelled"),
        ("failed", "no accepted node of tenant default matches role=gpu after 10m", [],
         "failed: no accepted node of tenant default matches role=gpu"),
        ("failed", None, [attempt_row(1, NODE_A, ended_because="timeout")], "failed: timeout"),
        ("failed", None, [], "failed: no reason given"),
    ],
)  # fmt: skip
def test_a_job_that_ended_another_way_is_one_line_and_exit_1(
    state: str, reason: str | None, attempts: list[dict[str, Any]], shown: str
) -> None:
    code, line = outcome(job_object(state=state, reason=reason, attempts=attempts))
    assert code == 1
    assert line is not None and line.startswith(f"job {JOB} {shown}")
    assert "\n" not in line


def test_a_hostile_reason_is_escaped() -> None:
    _, line = outcome(job_object(state="lost", reason="gone\x1b]0;owned\x07\n"))
    assert line == f"job {JOB} lost: gone\\x1b]0;owned\\x07\\x0a"


def test_a_move_is_headed_on_stderr_with_why_the_last_attempt_ended() -> None:
    first = attempt_row(1, NODE_A)
    blocked = attempt_row(1, NODE_A, ended_because="node blocked")
    second = attempt_row(2, NODE_B)
    done = job_object(
        state="succeeded",
        exit_code=0,
        attempts=[blocked, attempt_row(2, NODE_B, ended_because="exit", exit_code=0)],
    )
    _, out, err, _, _ = follow(
        [
            page([chunk(1, b"one\n")], job_object(attempts=[first])),
            page([], job_object(attempts=[first]), after=1),
            page([chunk(2, b"two\n", number=2, node=NODE_B)],
                 job_object(attempts=[blocked, second])),
            page([chunk(3, b"three\n", number=2, node=NODE_B)], done, after=2),
            page([], done, after=3),
        ]
    )  # fmt: skip
    assert out == b"one\ntwo\nthree\n"
    assert err == f"--- attempt 2 on {NODE_B} (attempt 1 ended: node blocked)\n".encode()


def test_a_new_attempt_is_named_before_it_prints_anything() -> None:
    failed = attempt_row(1, NODE_A, ended_because="exit", exit_code=3)
    moved = job_object(attempts=[failed, attempt_row(2, NODE_B)])
    done = job_object(state="failed", exit_code=3, attempts=[failed, dict(failed, number=2)])
    _, out, err, _, _ = follow(
        [
            page([], job_object()),  # queued: no attempt yet
            page([], job_object(attempts=[attempt_row(1, NODE_A)])),
            page([], moved),
            page([], moved),  # named once
            page([], done),
        ]
    )
    assert out == b""
    assert err == f"--- attempt 2 on {NODE_B} (attempt 1 ended: exit code 3)\n".encode()


def test_why_a_job_waits_is_said_once_per_reason() -> None:
    none = "no accepted node of tenant default matches role=gpu"
    down = "node node-00000000000a is not connected"
    waiting = [job_object(state="queued", reason=r) for r in (none, none, down, down)]
    failed = job_object(state="failed", reason=none + " for 10m")
    job, _, err, _, _ = follow([*[page([], j) for j in waiting], page([], failed)])
    assert err.decode().splitlines() == [
        f"--- job {JOB} queued: {none}",
        f"--- job {JOB} queued: {down}",
    ]
    assert outcome(job) == (1, f"job {JOB} failed: {none} for 10m")


def test_logs_head_every_attempt_and_mark_truncation() -> None:
    ended = job_object(
        state="succeeded",
        exit_code=0,
        attempts=[
            attempt_row(1, NODE_A, ended_because="node lost"),
            attempt_row(2, NODE_B, ended_because="exit", exit_code=0),
        ],
    )
    _, out, err, _, slept = follow(
        [
            page(
                [chunk(1, b"a" * 10), chunk(2, b"", truncated=True),
                 chunk(5, b"b\n", number=2, node=NODE_B, stream="stderr")],
                ended,
            ),
            page([], ended, after=5),
        ],
        headers="always",
    )  # fmt: skip
    assert out == b"a" * 10
    assert err.decode().splitlines() == [
        f"--- attempt 1 on {NODE_A} (ended: node lost)",
        "--- output of attempt 1 truncated: it passed the cap of 1 MiB per attempt,"
        " the rest was dropped",
        f"--- attempt 2 on {NODE_B} (ended: exit code 0)",
        "b",
    ]
    assert slept == []


def test_logs_without_follow_stop_once_caught_up() -> None:
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    _, out, err, _, slept = follow(
        [page([chunk(1, b"so far\n")], running), page([], running, after=1)],
        headers="always",
        keep_following=False,
    )
    assert out == b"so far\n"
    assert err == f"--- attempt 1 on {NODE_A}\n".encode()
    assert slept == []


def test_logs_without_follow_never_ask_the_server_to_wait() -> None:
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    _, _, _, fetch, _ = follow(
        [
            page([chunk(1, b"so far\n")], running, version="v1", waited=False),
            page([], running, after=1, version="v1", waited=False),
        ],
        keep_following=False,
    )
    assert fetch.waits == [(0, None), (0, "v1")]


def test_attempts_of_an_all_job_are_headed_by_node_only() -> None:
    attempts = [attempt_row(1, NODE_A), attempt_row(2, NODE_B)]
    done = job_object(state="succeeded", exit_code=0, all_nodes=True, attempts=attempts)
    _, out, err, _, _ = follow(
        [
            page(
                [chunk(1, b"a1\n"), chunk(2, b"b1\n", number=2, node=NODE_B),
                 chunk(3, b"a2\n")],
                done,
            ),
            page([], done, after=3),
        ]
    )  # fmt: skip
    assert out == b"a1\nb1\na2\n"
    assert err.decode().splitlines() == [
        f"--- attempt 2 on {NODE_B}",
        f"--- attempt 1 on {NODE_A}",
    ]


def test_a_hostile_node_name_in_a_header_is_escaped() -> None:
    done = job_object(state="succeeded", exit_code=0)
    _, _, err, _, _ = follow(
        [page([chunk(1, b"x", number=2, node="n\x1b[2J")], done), page([], done, after=1)]
    )
    assert err.decode().startswith("--- attempt 2 on n\\x1b[2J")


# --- `job run` following, through the command ------------------------------------------------


def test_job_run_prints_the_output_and_exits_with_the_command_exit_code(
    cli: CliRunner, api: RecordingApi
) -> None:
    done = job_object(state="failed", exit_code=7, attempts=[attempt_row(1, NODE_A, exit_code=7)])
    api.pages = [page([chunk(1, b"out\n"), chunk(2, b"err\n", stream="stderr")], done),
                 page([], done, after=2)]  # fmt: skip
    result = cli("job", "run", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert result.code == 7, result
    assert result.out == "out\n"
    assert result.err == "err\n"
    assert [query for _, query in api.gets] == [
        {"after": 0, "attempt": None},
        {"after": 2, "attempt": None},
    ]
    assert {path for path, _ in api.gets} == {f"/api/v1/jobs/{JOB}/output"}


def test_job_run_of_a_lost_job_says_so_and_exits_1(cli: CliRunner, api: RecordingApi) -> None:
    lost = job_object(state="lost", reason="node blocked; --no-move")
    api.pages = [page([], lost)]
    result = cli("job", "run", "--no-move", "--", "sleep", "60")
    assert result.code == 1
    assert result.err == f"job {JOB} lost: node blocked; --no-move\n"


def test_ctrl_c_leaves_the_job_running_and_says_how_to_follow_and_cancel(
    cli: CliRunner, api: RecordingApi, tmp_path: Path
) -> None:
    api.pages = [page([chunk(1, b"partial\n")], job_object()), KeyboardInterrupt()]
    context = tmp_path / "ctx dir" / "context.json"
    result = cli("job", "run", "--context", str(context), "--", "sleep", "60")
    assert result.code == 130
    assert result.out == "partial\n"
    quoted = f"'{context}'"
    assert f"orchestrator-zero job logs {JOB} --follow --context {quoted}" in result.err
    assert f"orchestrator-zero job cancel {JOB} --context {quoted}" in result.err
    assert "keeps running" in result.err
    assert len(api.posts) == 1  # the job was created and nothing cancelled it


def test_ctrl_c_while_creating_says_the_job_may_exist(
    cli: CliRunner, api: RecordingApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    def interrupted(path: str, body: dict[str, Any]) -> dict[str, Any]:
        raise KeyboardInterrupt

    monkeypatch.setattr(api, "post", interrupted)
    result = cli("job", "run", "--detach", "--", "true")
    assert result.code == 130
    assert result.out == ""
    assert "the job may have been created" in result.err and "job list" in result.err


def test_a_follow_that_loses_the_servers_says_the_job_may_still_run(
    cli: CliRunner, api: RecordingApi
) -> None:
    from cli.client import ApiError

    api.pages = [ApiError("no server of the context answered: x: refused")]
    result = cli("job", "logs", JOB, "--follow")
    assert result.code == 1
    assert result.err.count("\n") == 1
    assert "no server of the context answered" in result.err
    assert f"orchestrator-zero job logs {JOB} --follow" in result.err


def test_job_logs_follow_exits_as_job_run_does(cli: CliRunner, api: RecordingApi) -> None:
    done = job_object(state="failed", exit_code=4, attempts=[attempt_row(1, NODE_A, exit_code=4)])
    api.pages = [page([chunk(1, b"x\n")], done), page([], done, after=1)]
    result = cli("job", "logs", JOB, "--follow", "--attempt", "1")
    assert result.code == 4
    assert result.out == "x\n"
    assert result.err == f"--- attempt 1 on {NODE_A}\n"
    assert api.gets[0] == (f"/api/v1/jobs/{JOB}/output", {"after": 0, "attempt": 1})


def test_job_run_long_polls_with_a_read_deadline_past_the_wait(
    cli: CliRunner, api: RecordingApi
) -> None:
    running = job_object(attempts=[attempt_row(1, NODE_A)])
    done = job_object(
        state="succeeded", exit_code=0, attempts=[attempt_row(1, NODE_A, exit_code=0)]
    )
    api.pages = [
        page([], running, version="v1", waited=False),
        page([chunk(1, b"x\n")], done, version="v2", waited=True),
        page([], done, after=1, version="v2", waited=True),
    ]
    result = cli("job", "run", "--", "sh", "-c", "sleep 1; echo x")
    assert result.code == 0, result
    assert result.out == "x\n"
    assert [query for _, query in api.gets] == [
        {"after": 0, "attempt": None},
        {"after": 0, "attempt": None, "wait": 10, "seen": "v1"},
        {"after": 1, "attempt": None, "wait": 10, "seen": "v2"},
    ]
    # Every network wait has a deadline: the long poll's outlasts the wait it asks for.
    assert api.read_timeouts == [15.0, 25.0, 25.0]


# --- list and show ---------------------------------------------------------------------------


def test_list_and_show_escape_what_the_server_sends(cli: CliRunner, api: RecordingApi) -> None:
    hostile = job_object(
        state="lost", reason="r\x1b[2J", attempts=[attempt_row(1, "node-\x1b]0;x\x07")]
    )
    hostile["command"] = ["echo", "\x1b[31mred", "x" * 80]
    api.pages = [{"jobs": [hostile]}, hostile]
    listed = cli("job", "list")
    assert listed.code == 0, listed
    header, row = listed.out.splitlines()
    assert header.split() == ["ID", "STATE", "TENANT", "NODE(S)", "EXIT", "CREATED", "COMMAND"]
    assert "\x1b" not in listed.out and "\\x1b[31mred" in row and row.endswith("...")
    assert "node-\\x1b]0;x\\x07" in row
    shown = cli("job", "show", JOB)
    assert shown.code == 0, shown
    assert "\x1b" not in shown.out
    assert "r\\x1b[2J" in shown.out and "ATTEMPT" in shown.out


def test_secret_env_takes_each_value_from_the_cli_environment(
    cli: CliRunner, api: RecordingApi
) -> None:
    result = cli(
        "job", "run", "--secret-env", "DB_PASSWORD", "--secret-env", "API_KEY", "--detach",
        "--", "true", env={"DB_PASSWORD": "from-env-1", "API_KEY": "from-env-2"},
    )  # fmt: skip
    assert result.code == 0, result
    [(_, body)] = api.posts
    assert body["secret_env"] == {"DB_PASSWORD": "from-env-1", "API_KEY": "from-env-2"}
    assert "from-env" not in result.out + result.err


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--secret-env", "OZ0_TEST_NOT_SET"], "OZ0_TEST_NOT_SET is not set in this environment"),
        (["--secret-env", "DB_PASSWORD=on-the-line"], "give only the NAME"),
        (["--secret-env", "1X"], "invalid secret env '1X'"),
        (["--secret-env", "OZ0_JOB_ID"], "the node sets OZ0_JOB_ID itself"),
        (["--secret-env", "A", "--secret-env", "A"], "secret env A is given more than once"),
    ],
)
def test_a_bad_secret_env_is_one_line_exit_2_and_sends_nothing(
    cli: CliRunner, api: RecordingApi, args: list[str], says: str
) -> None:
    result = cli("job", "run", *args, "--", "true", env={"A": "x"})
    assert result.code == 2, result
    assert says in result.err and result.err.count("\n") == 1, result.err
    assert "on-the-line" not in result.err
    assert api.posts == []


def test_show_says_the_limits_asked_and_what_each_attempt_s_node_applied(
    cli: CliRunner, api: RecordingApi
) -> None:
    applied = {
        "user": "uid 61184 (its own)",
        "tracking": "cgroup v2",
        "private_tmp": "mount namespace",
        "swept": "nothing left",
        "limits": {
            "memory": "cgroup v1",
            "max_open_files": "rlimit",
            "cpu": "not applied: no cpu controller",
        },
    }
    job = job_object(
        state="running",
        attempts=[
            {**attempt_row(1, NODE_A, ended_because="exit", exit_code=1), "applied": applied},
            {
                **attempt_row(2, NODE_B, ended_because="node blocked"),
                "applied": None,
            },  # older agent
            attempt_row(3, NODE_A),
        ],
    )
    job["limits"] = {"memory": 512 << 20, "cpu": 0.5, "max_open_files": 1024}
    plain = job_object(state="succeeded", attempts=[attempt_row(1, NODE_A, ended_because="exit")])
    api.pages = [job, plain]
    shown = cli("job", "show", JOB)
    assert shown.code == 0, shown
    [limits] = [line for line in shown.out.splitlines() if line.startswith("limits:")]
    assert limits.split(None, 1)[1] == "memory 512 MiB, cpu 0.5, open files 1024"
    assert shown.out.splitlines()[-3:] == [
        "attempt 1: user uid 61184 (its own), tracked by cgroup v2, own /tmp and /var/tmp:"
        " mount namespace, swept: nothing left; limits: memory 512 MiB (cgroup v1),"
        " cpu 0.5 (not applied: no cpu controller), open files 1024 (rlimit)",
        "attempt 2: not reported",
        "attempt 3: running: the node says what it applied when the attempt ends",
    ]
    # No limits and nodes that said nothing (older agents): `limits: none`, nothing per attempt.
    before = cli("job", "show", JOB)
    assert before.code == 0, before
    [limits] = [line for line in before.out.splitlines() if line.startswith("limits:")]
    assert limits.split() == ["limits:", "none"]
    assert "attempt 1:" not in before.out and before.out.rstrip().splitlines()[-1].startswith("1")


# --- if its node is lost: --on-lost, --lost-after ---------------------------------------------


def test_on_lost_and_lost_after_are_sent_only_when_asked(cli: CliRunner, api: RecordingApi) -> None:
    for args in (
        ["--on-lost", "wait"],
        ["--on-lost", "fail", "--lost-after", "30s"],
        ["--lost-after", "1d"],
        ["--lost-after", "2h", "--on-lost", "move"],
        [],
    ):
        assert cli("job", "run", *args, "--detach", "--", "true").code == 0
    sent = [
        {k: v for k, v in body.items() if k in ("on_lost", "lost_after")} for _, body in api.posts
    ]
    # Neither by default: a server older than them refuses a field it does not know.
    assert sent == [
        {"on_lost": "wait"},
        {"on_lost": "fail", "lost_after": 30.0},
        {"lost_after": 86400.0},
        {"lost_after": 7200.0},
        {},
    ]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--on-lost", "sometimes"], "invalid on-lost 'sometimes': use move, wait or fail"),
        (["--on-lost", "Move"], "invalid on-lost 'Move'"),
        (["--lost-after", "4s"], "invalid lost-after '4s': give from 5s to 7d"),
        (["--lost-after", "8d"], "invalid lost-after '8d': give from 5s to 7d"),
        (["--lost-after", "soon"], "invalid duration 'soon'"),
        (["--lost-after", "0"], "longer than 0s"),
    ],
)
def test_a_bad_on_lost_or_lost_after_is_one_line_exit_2_and_sends_nothing(
    cli: CliRunner, api: RecordingApi, args: list[str], says: str
) -> None:
    result = cli("job", "run", *args, "--", "true")
    assert result.code == 2, result
    assert result.err.startswith("error: ") and result.err.count("\n") == 1, result.err
    assert says in result.err and args[0] in result.err
    assert api.posts == []


@pytest.mark.parametrize(
    ("on_lost", "lost_after", "says"),
    [("move", None, "move after 15 s"), ("wait", None, "wait 10 min, then move"),
     ("fail", 30.0, "fail after 30 s"), ("fail", 90.0, "fail after 90 s"),
     ("wait", 86400.0, "wait 1 d, then move"), (None, None, "move after 10 s")],
)  # fmt: skip
def test_show_says_what_becomes_of_the_job_if_its_node_is_lost(
    cli: CliRunner, api: RecordingApi, on_lost: str | None, lost_after: float | None, says: str
) -> None:
    job = job_object(state="running")
    if on_lost is not None:  # None: a server older than on_lost sends neither
        job.update(on_lost=on_lost, lost_after=lost_after)
    api.pages = [job]
    shown = cli("job", "show", JOB)
    assert shown.code == 0, shown
    [line] = [x for x in shown.out.splitlines() if x.startswith("if its node is lost:")]
    assert line.split(":", 1)[1].strip() == says


def test_the_api_takes_on_lost_and_lost_after_within_their_bounds() -> None:
    base = {"command": ["true"]}
    spec = JobSpec.from_json(base)
    assert (spec.on_lost, spec.lost_after) == ("move", None)
    spec = JobSpec.from_json({**base, "on_lost": "fail", "lost_after": 5})
    assert (spec.on_lost, spec.lost_after) == ("fail", 5.0)
    assert JobSpec.from_json({**base, "lost_after": 7 * 86400}).lost_after == 604800.0
    cases: list[tuple[dict[str, Any], str]] = [
        ({"on_lost": "later"}, "on_lost must be move, wait or fail"),
        ({"on_lost": None}, "on_lost must be move, wait or fail"),
        ({"lost_after": 4.9}, "lost_after must be from 5 to 604800 seconds"),
        ({"lost_after": 604801}, "lost_after must be from 5 to 604800 seconds"),
        ({"lost_after": "15s"}, "lost_after must be a number of seconds"),
        ({"lost_after": True}, "lost_after must be a number of seconds"),
        ({"lost_after": float("nan")}, "lost_after must be from 5"),
    ]
    for bad, says in cases:
        with pytest.raises(JobError) as caught:
            JobSpec.from_json({**base, **bad})
        assert says in str(caught.value), bad


def test_the_workflow_s_lost_after_defaults_are_the_command_line_s() -> None:
    # The workflow keeps its own copy (its sandbox imports nothing of ours).
    assert wf.ON_LOST == spec_text.ON_LOST
    assert wf.LOST_AFTER == spec_text.LOST_AFTER
    assert wf.JobInput("job-0123456789ab", ["true"]).lost_after_s == 15.0
    assert wf.JobInput("job-0123456789ab", ["true"], on_lost="wait").lost_after_s == 600.0
    assert wf.JobInput("job-0123456789ab", ["true"], lost_after=7.0).lost_after_s == 7.0
