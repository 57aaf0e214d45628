"""How `job run` shows a job on many nodes, without a server: the live line and the recap
(cli/job_recap.py), the output laid out by node (cli/job_lines.py), the status line on a
terminal (cli/job_screen.py), and all of it through the follower and the command, fed
recorded pages. Through a real terminal with real agents: tests/test_job_fanout_e2e.py."""

from __future__ import annotations

import base64
import io
import json
from typing import Any

import pytest

from cli import job_cmds
from cli.job_follow import Follower
from cli.job_lines import MAX_LINE, Grouped, Prefixed, Raw
from cli.job_recap import MAX_LISTED, progress_line, recap_json, recap_lines, tally
from cli.job_screen import LINES, LIVE, Screen
from cli.job_view import View
from tests.conftest import CliRunner

JOB = "job-0123456789ab"
A, B, C, D = (f"node-00000000000{x}" for x in "abcd")


def attempt_row(
    number: int, node: str, *, part: int | None = None, because: str | None = None,
    code: int | None = None, detail: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    return {
        "number": number, "part": number - 1 if part is None else part, "node": node,
        "state": "running" if because is None else "ended", "exit_code": code,
        "ended_because": because, "ended_detail": detail,
    }  # fmt: skip


def job(
    attempts: list[dict[str, Any]], *, state: str = "running", parts: dict[str, Any] | None = None,
    all_nodes: bool = True, exit_code: int | None = None, reason: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    ended = state in ("succeeded", "failed", "cancelled", "lost")
    return {
        "id": JOB, "state": state, "reason": reason, "all": all_nodes, "exit_code": exit_code,
        "started_at": "2026-12-01T11:00:00+00:00",
        "ended_at": "2026-12-01T11:00:12.5+00:00" if ended else None,
        "attempts": attempts, "parts": parts,
    }  # fmt: skip


def parts(total: int, *, waiting: int = 0, not_started: int = 0) -> dict[str, Any]:
    return {"total": total, "waiting": waiting, "not_started": not_started}


def ok(number: int, node: str) -> dict[str, Any]:
    return attempt_row(number, node, because="exit", code=0)


# --- the live line --------------------------------------------------------------------------


def test_the_live_line_counts_parts_by_where_they_are() -> None:
    running = job(
        [ok(1, A), attempt_row(2, B, because="exit", code=3), attempt_row(3, C),
         attempt_row(4, D, because="timeout", code=137)],
        parts=parts(6, waiting=2),
    )  # fmt: skip
    assert progress_line(JOB, tally(running)) == (
        f"{JOB}: 1 ok, 2 failed, 1 running, 2 waiting of 6"
    )
    # Lost and not started only when there are some.
    later = job(
        [ok(1, A), attempt_row(2, B, because="node blocked"), ok(3, C)],
        parts=parts(5, not_started=2),
    )
    assert progress_line(JOB, tally(later)) == (
        f"{JOB}: 2 ok, 0 failed, 1 lost, 2 not started, 0 running, 0 waiting of 5"
    )


def test_a_part_is_where_its_last_attempt_is() -> None:
    # Part 0 failed, was retried (attempt 3 on the same node) and now runs again.
    retried = job(
        [attempt_row(1, A, because="exit", code=1), ok(2, B), attempt_row(3, A, part=0)],
        parts=parts(2),
    )
    assert progress_line(JOB, tally(retried)) == (
        f"{JOB}: 1 ok, 0 failed, 1 running, 0 waiting of 2"
    )


def test_a_job_on_one_node_is_one_part_waiting_until_placed() -> None:
    queued = job([], state="queued", all_nodes=False)
    assert progress_line(JOB, tally(queued)) == f"{JOB}: 0 ok, 0 failed, 0 running, 1 waiting of 1"
    moved = job(
        [attempt_row(1, A, part=0, because="node lost"), attempt_row(2, B, part=0)], all_nodes=False
    )
    assert progress_line(JOB, tally(moved)) == f"{JOB}: 0 ok, 0 failed, 1 running, 0 waiting of 1"
    assert progress_line(JOB, tally(job([], state="queued", parts=parts(0)))) == (
        f"{JOB}: waiting for nodes"
    )


# --- the recap ------------------------------------------------------------------------------


def finished() -> dict[str, Any]:
    return job(
        [ok(1, A), attempt_row(2, B, because="exit", code=3), ok(3, C),
         attempt_row(4, D, because="node lost", detail="no server heard from it for 15 s"),
         attempt_row(5, "node-00000000000e", because="exit", code=1), ok(6, "node-00000000000f"),
         attempt_row(7, "node-000000000010", because="timeout", code=143)],
        state="failed", exit_code=3, parts=parts(8, not_started=1),
        reason="4 of 8 nodes failed",
    )  # fmt: skip


def test_the_recap_counts_outcomes_and_exit_codes_and_names_what_failed_or_was_lost() -> None:
    assert recap_lines(finished()) == [
        f"RECAP {JOB}: failed in 12.5 s on 8 nodes",
        "  ok=3  failed=2  timeout=1  lost=1  not_started=1",
        "  exit codes: 0=3  1=1  3=1",
        f"  {D}  lost     node lost: no server heard from it for 15 s",
        f"  {B}  failed   exit code 3",
        "  node-00000000000e  failed   exit code 1",
        "  node-000000000010  timeout  timeout",
    ]


def test_the_recap_as_data() -> None:
    recap = recap_json(finished())
    assert json.loads(json.dumps(recap)) == recap
    assert (recap["job"], recap["state"], recap["exit_code"]) == (JOB, "failed", 3)
    assert (recap["seconds"], recap["nodes"]) == (12.5, 8)
    assert recap["outcomes"] == {
        "ok": 3, "failed": 2, "timeout": 1, "cancelled": 0, "refused": 0, "lost": 1,
        "not_started": 1, "running": 0, "waiting": 0,
    }  # fmt: skip
    assert recap["exit_codes"] == {"0": 3, "1": 1, "3": 1}
    assert recap["parts"][1] == {
        "part": 1, "node": B, "outcome": "failed", "exit_code": 3, "reason": "exit code 3",
        "attempts": 1,
    }  # fmt: skip
    # Scripts see the text, keys in this order (docs/run-jobs.md): not only the same dict.
    assert json.dumps(recap["parts"][1]) == (
        f'{{"part": 1, "node": "{B}", "outcome": "failed", "exit_code": 3,'
        ' "reason": "exit code 3", "attempts": 1}'
    )
    assert recap["parts"][3]["reason"] == "node lost: no server heard from it for 15 s"


def test_the_recap_lists_at_most_so_many_parts_and_escapes_what_nodes_said() -> None:
    many = [attempt_row(n, f"node-{n:012x}", because="exit", code=2) for n in range(1, 80)]
    many[0] = attempt_row(1, "node-\x1b[2J", because="node lost", detail="gone\x07")
    lines = recap_lines(job(many, state="failed", exit_code=2, parts=parts(79)))
    listed = [line for line in lines if line.startswith("  node-")]
    assert len(listed) == MAX_LISTED
    assert listed[0] == "  node-\\x1b[2J  lost    node lost: gone\\x07"
    assert lines[-1] == f"  ... and {79 - MAX_LISTED} more: orchestrator-zero job show {JOB}"
    assert all(line.isprintable() for line in lines)


# --- output laid out by node ----------------------------------------------------------------


def written(writes: list[tuple[str, bytes]]) -> tuple[bytes, bytes]:
    out = b"".join(data for stream, data in writes if stream == "stdout")
    err = b"".join(data for stream, data in writes if stream == "stderr")
    return out, err


def test_prefixed_lines_are_whole_and_never_mix_between_nodes() -> None:
    lines = Prefixed()
    writes = []
    writes += lines.output(1, A, "stdout", b"a says ")
    writes += lines.output(2, B, "stdout", b"b says hello\nb again")
    writes += lines.output(1, A, "stdout", b"hello\r\n")
    writes += lines.output(1, A, "stderr", b"a's error\n")
    assert writes == [
        ("stdout", f"{B}: b says hello\n".encode()),
        ("stdout", f"{A}: a says hello\n".encode()),
        ("stderr", f"{A}: a's error\n".encode()),
    ]
    # Its attempt ended: what was held is a line of its own.
    assert lines.ended(2, B, "exit code 0") == [("stdout", f"{B}: b again\n".encode())]
    assert lines.ended(1, A, "exit code 0") == []


def test_prefixed_and_grouped_output_cannot_drive_the_terminal() -> None:
    hostile = b"\x1b[2Jcleared\rnode-00000000000b: forged\tcol \xff\xe2\x80\xaeend\n"
    out, _ = written(Prefixed().output(1, A, "stdout", hostile))
    assert out.decode() == (
        f"{A}: \\x1b[2Jcleared\\x0dnode-00000000000b: forged\tcol \\xff\\u202eend\n"
    )
    grouped = Grouped()
    grouped.output(1, "node-\x1b]0;x\x07", "stdout", hostile)
    out, _ = written(grouped.ended(1, "ignored", "exit code 0"))
    assert out.decode().splitlines() == [
        "--- node-\\x1b]0;x\\x07: exit code 0",
        "\\x1b[2Jcleared\\x0dnode-00000000000b: forged\tcol \\xff\\u202eend",
    ]


def test_a_line_longer_than_the_cap_is_written_in_pieces() -> None:
    lines = Prefixed()
    writes = lines.output(1, A, "stdout", b"x" * (MAX_LINE + 10))
    assert writes == [("stdout", f"{A}: {'x' * MAX_LINE}\n".encode())]
    assert lines.finish() == [("stdout", f"{A}: {'x' * 10}\n".encode())]


def test_grouped_prints_each_attempt_as_one_block_when_it_ends() -> None:
    lines = Grouped()
    assert lines.output(1, A, "stdout", b"a1\na") == []
    assert lines.output(2, B, "stdout", b"b1\n") == []
    assert lines.output(1, A, "stdout", b"2\n") == []
    assert lines.output(1, A, "stderr", b"a-err") == []
    assert lines.note("--- output of attempt 1 truncated", 1) == []
    assert lines.ended(2, B, "exit code 0") == [
        ("stdout", f"--- {B}: exit code 0\n".encode()),
        ("stdout", b"b1\n"),
    ]
    assert lines.ended(1, A, "exit code 3") == [
        ("stdout", f"--- {A}: exit code 3\n".encode()),
        ("stdout", b"a1\na2\n"),
        ("stderr", b"a-err\n"),
        ("stderr", b"--- output of attempt 1 truncated\n"),
    ]
    # One that printed nothing has its block too; a note of no attempt goes out at once.
    assert lines.ended(3, C, "node lost") == [("stdout", f"--- {C}: node lost\n".encode())]
    assert lines.note("--- job queued") == [("stderr", b"--- job queued\n")]


def test_raw_is_the_bytes_as_they_come() -> None:
    assert Raw().output(1, A, "stdout", b"\x1b[2J\xff") == [("stdout", b"\x1b[2J\xff")]


# --- the status line ------------------------------------------------------------------------


def screen(mode: str, *, columns: int = 80, out_on_terminal: bool = True) -> Screen:
    return Screen(
        io.BytesIO(), io.BytesIO(), status=mode, out_on_terminal=out_on_terminal,
        columns=lambda: columns,
    )  # fmt: skip


def err_of(s: Screen) -> bytes:
    value: bytes = s.err.getvalue()  # type: ignore[attr-defined]
    return value


def test_the_live_line_is_redrawn_in_place_and_wiped_around_output() -> None:
    s = screen(LIVE)
    s.status("1 of 3")
    s.status("1 of 3")  # the same: not drawn again
    s.status("2 of 3")
    s.write([("stdout", b"hello\n")])
    s.clear()
    assert err_of(s) == (
        b"\r1 of 3"
        b"\r      \r\r2 of 3"  # wiped, drawn again
        b"\r      \r"  # wiped before the output
        b"\r2 of 3"  # and back after it
        b"\r      \r"  # gone for good
    )
    assert s.out.getvalue() == b"hello\n"  # type: ignore[attr-defined]


def test_the_live_line_waits_for_a_line_a_node_left_unended_and_fits_the_terminal() -> None:
    s = screen(LIVE, columns=10)
    s.write([("stdout", b"no newline")])
    s.status("job-0123456789ab: 1 ok")
    assert err_of(s) == b""  # it would cut the node's line
    s.write([("stdout", b" yet\n")])
    assert err_of(s) == b"\rjob-01234"  # cut to the width, less one
    s = screen(LIVE)
    s.write([("stderr", b"partial")])
    s.clear()
    assert err_of(s) == b"partial\n"  # what is printed next starts a line


def test_the_live_line_on_a_terminal_other_than_stdout_ignores_stdout() -> None:
    s = screen(LIVE, out_on_terminal=False)
    s.write([("stdout", b"to a file, no newline")])
    s.status("x")
    assert err_of(s) == b"\rx"


def test_progress_asked_for_a_pipe_is_a_line_per_change() -> None:
    s = screen(LINES)
    for text in ("a", "a", "b"):
        s.status(text)
    s.write([("stdout", b"out\n")])
    s.status("b")
    s.clear()
    assert err_of(s) == b"a\nb\n"


# --- through the follower and the command ---------------------------------------------------


def chunk(
    cursor: int, number: int, node: str, data: bytes, stream: str = "stdout"
) -> dict[str, Any]:
    return {
        "cursor": cursor, "attempt": number, "node": node, "stream": stream,
        "data": base64.b64encode(data).decode(), "truncated": False,
    }  # fmt: skip


def page(
    chunks: list[dict[str, Any]], of: dict[str, Any], *, after: int = 0, more: bool = False
) -> dict[str, Any]:
    cursor = chunks[-1]["cursor"] if chunks else after
    ended = of["state"] in ("succeeded", "failed", "cancelled", "lost")
    return {"chunks": chunks, "cursor": cursor, "more": more, "ended": ended, "job": of}


def recorded(pages: list[dict[str, Any]]) -> Any:
    def fetch(after: int, wait: int, seen: str | None) -> dict[str, Any]:
        return pages.pop(0)

    return fetch


def test_a_block_waits_for_a_page_that_caught_up_with_its_end() -> None:
    both_running = job([attempt_row(1, A), attempt_row(2, B)], parts=parts(2))
    a_ended = job([ok(1, A), attempt_row(2, B)], parts=parts(2))
    done = job([ok(1, A), ok(2, B)], state="succeeded", exit_code=0, parts=parts(2))
    s = screen(LINES, out_on_terminal=False)
    view = View(JOB, Grouped(), s)
    follower = Follower(
        recorded(
            [
                page([chunk(1, 1, A, b"a\n"), chunk(2, 2, B, b"b\n")], both_running),
                # A has ended, but this page did not hold all there was: nothing yet.
                page([chunk(3, 1, A, b"a-last\n")], a_ended, more=True),
                page([], a_ended, after=3),
                page([chunk(4, 2, B, b"b-last\n")], done, after=3),
                page([], done, after=4),
            ]
        ),
        io.BytesIO(), io.BytesIO(), sink=view, node_headers=False, sleep=lambda _: None,
    )  # fmt: skip
    follower.run(follow=True)
    view.stop()
    out = s.out.getvalue().decode()  # type: ignore[attr-defined]
    assert out == f"--- {A}: exit code 0\na\na-last\n--- {B}: exit code 0\nb\nb-last\n"
    assert err_of(s).decode().splitlines() == [
        f"{JOB}: 0 ok, 0 failed, 2 running, 0 waiting of 2",
        f"{JOB}: 1 ok, 0 failed, 1 running, 0 waiting of 2",
        f"{JOB}: 2 ok, 0 failed, 0 running, 0 waiting of 2",
    ]


class Api:
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        self.pages = pages

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return {"id": JOB, "state": "queued"}

    def get(self, path: str, query: Any = None, *, read_timeout: float = 15.0) -> Any:
        return self.pages.pop(0)


def run_all(cli: CliRunner, monkeypatch: pytest.MonkeyPatch, *args: str) -> Any:
    running = job([attempt_row(1, A), attempt_row(2, B)], parts=parts(3, waiting=1))
    done = job(
        [ok(1, A), attempt_row(2, B, because="exit", code=4), ok(3, C)],
        state="failed", exit_code=4, parts=parts(3),
    )  # fmt: skip
    pages = [
        page([chunk(1, 1, A, b"from "), chunk(2, 2, B, b"b\n"), chunk(3, 1, A, b"a\n")], running),
        page([chunk(4, 3, C, b"c\n", "stderr")], done, after=3),
        page([], done, after=4),
    ]
    monkeypatch.setattr(job_cmds, "select", lambda context: None)
    monkeypatch.setattr(job_cmds, "ApiClient", lambda context: Api(pages))
    return cli("job", "run", "--all", *args, "--", "sh", "-c", "x")


def test_on_a_pipe_the_default_is_as_before(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_all(cli, monkeypatch)
    assert result.code == 4
    assert result.out == "from b\na\n"
    assert "RECAP" not in result.err and " ok, " not in result.err


def test_prefixed_on_a_pipe_with_progress_asked(
    cli: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = run_all(cli, monkeypatch, "--output", "prefixed", "--progress")
    assert result.code == 4
    assert result.out == f"{B}: b\n{A}: from a\n"
    assert result.err.splitlines() == [
        f"{JOB}: 0 ok, 0 failed, 2 running, 1 waiting of 3",
        f"{C}: c",
        f"{JOB}: 2 ok, 1 failed, 0 running, 0 waiting of 3",
        f"RECAP {JOB}: failed in 12.5 s on 3 nodes",
        "  ok=2  failed=1  lost=0",
        "  exit codes: 0=2  4=1",
        f"  {B}  failed  exit code 4",
    ]


def test_json_is_the_recap_as_data(cli: CliRunner, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_all(cli, monkeypatch, "--json")
    assert result.code == 4
    recap = json.loads(result.out)  # the output itself stays in the cluster
    assert recap["outcomes"]["ok"] == 2 and recap["exit_codes"] == {"0": 2, "4": 1}
    assert [p["node"] for p in recap["parts"]] == [A, B, C]
    assert result.err == ""
