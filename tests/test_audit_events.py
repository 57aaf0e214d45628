"""The audit log followed (issue 45): GET /api/v1/events and `audit follow` against a real
server on 127.0.0.57 and the suite's PostgreSQL.

The stream is exact across disconnects under a burst of transactions that commit out of
the order of their rows' ids (some held open while later ones commit, some rolled back):
every committed row once, in cursor order, none of a rolled-back one. Each person reads
the rows the audit list shows it. The CLI follows through the server, and through its
restart, resuming from its cursor. The follower's own rules (failover, a line cut off, a
refusal, giving up) are held with a fake stream.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import queue
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from cli.audit_follow import Follower
from cli.client import StreamRefused, Unreachable
from fixtures import scoped_people
from fixtures.cluster import REPO, ClusterFiles, Served
from fixtures.scoped_people import Person
from oz0 import audit, audit_stream
from oz0.errors import Oz0Error

ADDRESS = "127.0.0.57"
ADVERTISE = ADDRESS  # the module's one server (`served`, tests/conftest.py)
SERVER_ARGS = ("--max-event-streams-per-person", "3")
WRITER = audit.Actor("server", "burst-writer")
# A stream's longest wait for a row it is owed: rows wait behind every older transaction
# of the PostgreSQL instance, which other test files share.
OWED_WITHIN = 90.0


@dataclass(frozen=True)
class World:
    files: ClusterFiles
    database: str
    root: Person  # admin, every tenant
    ada: Person  # admin of acme
    vera: Person  # viewer, every tenant
    bo: Person  # viewer of beta
    capped: Person  # an operator whose streams fill the cap


@pytest.fixture(scope="module")
def world(served: Served, tmp_path_factory: pytest.TempPathFactory) -> World:
    files = served.files
    root_dir = tmp_path_factory.mktemp("people")
    root = scoped_people.make(files, root_dir, ADDRESS, "root", "admin", [])
    for tenant in ("acme", "beta"):
        root.ok("POST", "/api/v1/tenants", {"name": tenant})
    made = {
        name: scoped_people.make(files, root_dir, ADDRESS, name, role, tenants)
        for name, role, tenants in [
            ("ada", "admin", ["acme"]), ("vera", "viewer", []), ("bo", "viewer", ["beta"]),
            ("cap", "operator", []),
        ]
    }  # fmt: skip
    database = files.main_db
    return World(files, database, root, made["ada"], made["vera"], made["bo"], made["cap"])


class Stream:
    """One GET /api/v1/events, read a line at a time."""

    def __init__(self, person: Person, **query: Any) -> None:
        self.https = person.connection()
        pairs = [(k, v) for k, values in query.items() for v in _listed(values)]
        self.https.request("GET", "/api/v1/events?" + urllib.parse.urlencode(pairs))
        self.answer = self.https.getresponse()
        self.status = self.answer.status
        self.media_type = (self.answer.getheader("Content-Type") or "").split(";")[0]

    def error(self) -> str:
        body = json.loads(self.answer.read())
        self.close()
        return str(body["error"])

    def line(self) -> dict[str, Any]:
        raw = self.answer.readline()
        assert raw.endswith(b"\n"), f"the stream ended: {raw!r}"
        found: dict[str, Any] = json.loads(raw)
        return found

    def lines_until_end(self) -> list[dict[str, Any]]:
        found = []
        while True:
            line = self.line()
            found.append(line)
            if "end" in line:
                self.close()
                return found

    def cut(self) -> None:
        """Break the connection as a network would: what was in flight is lost."""
        sock = self.https.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self.close()

    def close(self) -> None:
        self.answer.close()
        self.https.close()


def reopen(person: Person, **query: Any) -> Stream:
    """A stream again after a cut: the server frees the cut one's slot when it next writes
    to it (its keep-alive), so the person's cap may refuse it until then, as the CLI
    finds."""
    deadline = time.monotonic() + 10
    while True:
        stream = Stream(person, **query)
        if stream.status != 429 or time.monotonic() > deadline:
            assert stream.status == 200, (stream.status, stream.error())
            return stream
        stream.error()
        time.sleep(0.1)


def _listed(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list | tuple) else [value]


def position(cursor: str) -> tuple[int, int]:
    """(xid, id) in a cursor: what orders the stream."""
    key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    return int(key["x"]), int(key["id"])


def now_cursor(person: Person, **query: Any) -> str:
    """A cursor of now: what a stream from now starts at, read as a catch-up."""
    lines = Stream(person, follow="false", **query).lines_until_end()
    return str(lines[-1]["cursor"])


# --- the stream is exact across disconnects --------------------------------------------


@dataclass
class Burst:
    """Writers of audit rows in transactions of one to three rows, committing out of the
    order of their ids (some held open a while, some rolled back), until a holder has
    held a row three times while others committed higher ids past it."""

    database: str
    writers: int = 6
    committed: list[str] = field(default_factory=list)
    rolled_back: list[str] = field(default_factory=list)
    # When each committed row's transaction had committed (the monotonic clock).
    commit_at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        self.threads = [
            threading.Thread(target=self._write, args=(n,), daemon=True)
            for n in range(self.writers)
        ]
        self.threads.append(threading.Thread(target=self._hold, daemon=True))
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()

    def _hold(self) -> None:
        try:
            with psycopg.connect(self.database, autocommit=True) as conn:
                for round_ in range(3):
                    target = f"hold-{round_}"
                    with conn.transaction():
                        audit.record(conn, WRITER, "burst.write", target, tenants=["acme"])
                        # Held while the others commit higher ids past it, and a while more.
                        passed = len(self.committed) + 10
                        deadline = time.monotonic() + 20
                        while len(self.committed) < passed and time.monotonic() < deadline:
                            time.sleep(0.02)
                        time.sleep(1.0)
                    self._done([target], True)
                    time.sleep(0.2)
        finally:
            self.stop.set()

    def _write(self, writer: int) -> None:
        draw = random.Random(writer)
        with psycopg.connect(self.database, autocommit=True) as conn:
            n = 0
            while not self.stop.is_set():
                n += 1
                rows = [(f"w{writer}-{n}-{k}", {"n": n}) for k in range(draw.choice((1, 1, 2, 3)))]
                keep = draw.random() > 0.1
                with conn.transaction():
                    audit.record_many(conn, WRITER, "burst.write", rows,
                                      tenants=[["acme"]] * len(rows))  # fmt: skip
                    if draw.random() < 0.25:
                        time.sleep(draw.uniform(0.05, 0.4))  # its ids held meanwhile
                    if not keep:
                        raise psycopg.Rollback()
                self._done([t for t, _ in rows], keep)
                time.sleep(draw.uniform(0, 0.02))

    def _done(self, targets: list[str], kept: bool) -> None:
        now = time.monotonic()
        with self.lock:
            (self.committed if kept else self.rolled_back).extend(targets)
            if kept:
                self.commit_at.update(dict.fromkeys(targets, now))


def test_a_stream_resumed_after_disconnects_under_a_burst_is_exact(world: World) -> None:
    """Cut three times mid-burst and resumed from the last cursor read: every committed row
    once, in cursor order (strictly rising), none rolled back. Broken on purpose (a cursor
    of the row id alone, `id > last`), the held rows are skipped and this fails."""
    query = {"kind": "burst", "keepalive": 1}
    stream = Stream(world.root, **query)
    assert stream.status == 200 and stream.media_type == "application/x-ndjson"
    first = stream.line()
    assert first["keepalive"] is True
    cursor = first["cursor"]
    burst = Burst(world.database)
    burst.start()
    got: list[dict[str, Any]] = []
    arrived: dict[str, float] = {}
    cuts = [20, 60, 120]
    deadline = time.monotonic() + OWED_WITHIN
    done = False
    while time.monotonic() < deadline:
        line = stream.line()
        cursor = line["cursor"]
        if "action" in line:
            got.append(line)
            arrived[line["target"]] = time.monotonic()
            if cuts and len(got) >= cuts[0]:
                cuts.pop(0)
                stream.cut()
                stream = reopen(world.root, after=cursor, **query)
        if not done and not any(t.is_alive() for t in burst.threads):
            burst.join()
            done = True
        if done and {e["target"] for e in got} >= set(burst.committed):
            # One keep-alive more: anything still owed (a row twice) would come before.
            while "keepalive" not in (line := stream.line()):
                got.append(line)
            break
    stream.close()
    assert done, "the burst did not end"
    assert not cuts, "the stream was not cut as often as planned"
    targets = [e["target"] for e in got]
    assert len(targets) == len(set(targets)), "a row came twice"
    assert sorted(targets) == sorted(burst.committed), (
        f"missing {sorted(set(burst.committed) - set(targets))[:10]},"
        f" extra {sorted(set(targets) - set(burst.committed))[:10]}"
    )
    assert not set(targets) & set(burst.rolled_back)
    positions = [position(e["cursor"]) for e in got]
    assert positions == sorted(positions) and len(set(positions)) == len(positions)
    assert all(e["action"] == "burst.write" and e["tenants"] == ["acme"] for e in got)
    # From a commit to its line (rows behind a held one wait for it: that is the rule).
    waits = sorted(max(0.0, arrived[t] - burst.commit_at[t]) for t in burst.committed)
    print(
        f"burst: {len(got)} rows, {len(burst.rolled_back)} rolled back; commit to line"
        f" p50 {waits[len(waits) // 2]:.3f} s, p99 {waits[len(waits) * 99 // 100]:.3f} s,"
        f" max {waits[-1]:.3f} s"
    )
    # What makes `id > last` skip rows happened: rows of higher ids committed before each
    # held one (the list is in the order of commits).
    ids = {e["target"]: e["id"] for e in got}
    for held in ("hold-0", "hold-1", "hold-2"):
        before = burst.committed[: burst.committed.index(held)]
        assert any(ids[t] > ids[held] for t in before), f"nothing overtook {held}"


def test_a_row_committed_after_a_higher_one_is_read_once_in_its_place(world: World) -> None:
    """The pitfall itself, step by step on the database: A writes a row and holds its
    transaction, B writes a higher id and commits. A reader must not pass A's row: it
    waits (held), then reads A's and B's in order once A commits."""
    with (
        psycopg.connect(world.database, autocommit=True) as a,
        psycopg.connect(world.database, autocommit=True) as b,
        psycopg.connect(world.database, autocommit=True) as reader,
    ):
        start = audit_stream.now(reader)
        kinds = ("pitfall",)
        with a.transaction():
            audit.record(a, WRITER, "pitfall.row", "a")
            audit.record(b, WRITER, "pitfall.row", "b")  # committed at once, a higher id
            while_held = audit_stream.read(reader, start, kinds=kinds)
            assert while_held.events == [] and while_held.held
        after = while_held.position
        got: list[str] = []
        deadline = time.monotonic() + OWED_WITHIN
        while len(got) < 2:
            assert time.monotonic() < deadline, f"read only {got}"
            batch = audit_stream.read(reader, after, kinds=kinds)
            got += [e.target for e in batch.events]
            after = batch.position
            time.sleep(0.05)
        assert got == ["a", "b"]
        assert audit_stream.read(reader, after, kinds=kinds).events == []


# --- scope ---------------------------------------------------------------------------------


def test_each_person_reads_the_rows_the_audit_list_shows_it(world: World) -> None:
    start = now_cursor(world.root)
    with psycopg.connect(world.database, autocommit=True) as conn:
        for tenants in (["acme"], ["beta"], ["acme", "beta"], []):
            audit.record(conn, WRITER, "scope.row", f"scope:{'+'.join(tenants)}",
                         tenants=tenants)  # fmt: skip
    wanted = {
        "root": {"scope:acme", "scope:beta", "scope:acme+beta", "scope:"},
        "vera": {"scope:acme", "scope:beta", "scope:acme+beta", "scope:"},
        "ada": {"scope:acme"},
        "bo": {"scope:beta"},
    }
    # Once the root has them all, every row is past the horizon (which only rises), so one
    # catch-up of each person's from the start gives all it may read.
    seen: set[str] = set()
    after, deadline = start, time.monotonic() + OWED_WITHIN
    while seen != wanted["root"]:
        assert time.monotonic() < deadline, f"the root read only {seen}"
        lines = Stream(world.root, after=after, kind="scope", follow="false").lines_until_end()
        seen |= {line["target"] for line in lines if "action" in line}
        after = lines[-1]["cursor"]
        time.sleep(0.1)
    people = {"root": world.root, "vera": world.vera, "ada": world.ada, "bo": world.bo}
    for name, person in people.items():
        listed = person.ok("GET", "/api/v1/audit?action=scope.row&limit=100")["entries"]
        lines = Stream(person, after=start, kind="scope", follow="false").lines_until_end()
        streamed = [line for line in lines if "action" in line]
        assert {e["target"] for e in streamed} == wanted[name], name
        # The same rows as the audit list, field for field (the list has no cursor, nor
        # the tenants).
        shared = ("id", "time", "actor", "action", "target", "details")
        assert sorted([{k: e[k] for k in shared} for e in streamed], key=lambda e: e["id"]) == (
            sorted(listed, key=lambda e: e["id"])
        ), name
        assert lines[-1]["end"] == "caught up"


def test_a_stream_ends_when_its_persons_tenants_change(world: World, tmp_path: Path) -> None:
    ada2 = scoped_people.make(world.files, tmp_path, ADDRESS, "ada2", "admin", ["acme"])
    stream = Stream(ada2, keepalive=1)
    assert "keepalive" in stream.line()
    world.root.ok("PATCH", "/api/v1/operators/ada2", {"tenants": ["acme", "beta"]})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        line = stream.line()
        if "end" in line:
            assert line["end"] == "your certificate, role or tenants changed; connect again"
            break
    else:
        raise AssertionError("the stream went on with the old tenants")
    stream.close()


# --- caps, input, keep-alives -----------------------------------------------------------


def test_a_persons_streams_past_the_cap_are_refused(world: World) -> None:
    held = [Stream(world.capped, keepalive=1) for _ in range(3)]
    for stream in held:
        assert stream.status == 200 and "keepalive" in stream.line()
    refused = Stream(world.capped)
    assert refused.status == 429
    assert refused.error() == (
        "cap has 3 event streams open on this server, the limit per person (server start"
        " --max-event-streams-per-person); end one first"
    )
    held.pop().cut()
    # The server sees the stream gone at its next keep-alive, a second on.
    deadline = time.monotonic() + 10
    while True:
        again = Stream(world.capped)
        if again.status == 200:
            again.close()
            break
        again.error()
        assert time.monotonic() < deadline, "the cut stream's slot was never freed"
        time.sleep(0.2)
    for stream in held:
        stream.close()


@pytest.mark.parametrize(
    ("query", "error"),
    [
        (
            {"after": "nope"},
            "after must be a cursor the stream gave (an event's or a keep-alive's), or start",
        ),
        (
            {"kind": "Node!"},
            "kind 'Node!' is not an action (node.accept) or its first parts (node)",
        ),
        ({"keepalive": "0"}, "keepalive must be a whole number of seconds from 1 to 300"),
        ({"follow": "maybe"}, "follow must be true or false"),
    ],
)
def test_bad_input_is_one_line(world: World, query: dict[str, str], error: str) -> None:
    stream = Stream(world.vera, **query)
    assert stream.status == 400
    assert stream.error() == error


def test_an_idle_stream_sends_keepalives_with_its_cursor(world: World) -> None:
    stream = Stream(world.vera, kind="nothing.ever", keepalive=1)
    began = time.monotonic()
    lines = [stream.line() for _ in range(3)]
    took = time.monotonic() - began
    stream.close()
    assert all(line["keepalive"] is True and "cursor" in line for line in lines)
    assert 1.5 <= took <= 6, took
    # Past rows it does not want, the cursor moves on.
    assert position(lines[-1]["cursor"]) >= position(lines[0]["cursor"])


# --- the CLI ----------------------------------------------------------------------------


def _follow_cli(world: World, *args: str) -> subprocess.Popen[str]:
    env = {**os.environ, **world.files.cli_env, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "cli.main", "audit", "follow", *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _lines_of(pipe: Any) -> queue.Queue[str | None]:
    lines: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        with contextlib.suppress(ValueError, OSError):  # closed by _end
            for line in pipe:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def _end(process: subprocess.Popen[str]) -> int:
    """Interrupt PROCESS as Ctrl-C would; its exit code, its pipes closed."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        code = process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        code = process.wait(10)
    time.sleep(0.2)  # the readers see the end of the pipes
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            pipe.close()
    return code


def _wait_for(lines: queue.Queue[str | None], count: int, timeout: float) -> list[str]:
    found: list[str] = []
    deadline = time.monotonic() + timeout
    while len(found) < count:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, f"ended after {found}"
        found.append(line)
    return found


def _write(world: World, action: str, targets: list[str]) -> None:
    with psycopg.connect(world.database, autocommit=True) as conn:
        for target in targets:
            audit.record(conn, WRITER, action, target)


def test_the_cli_prints_text_lines_by_default(world: World) -> None:
    follow = _follow_cli(world, "--kind", "text", "--keepalive", "1", "--after", "start")
    out = _lines_of(follow.stdout)
    try:
        _write(world, "text.line", ["node:\x1b[31mred"])
        line = _wait_for(out, 1, OWED_WITHIN)[0]
        assert "server:burst-writer  text.line  node:\\x1b[31mred" in line
    finally:
        _end(follow)


def test_the_cli_resumes_from_its_cursor_file(world: World, tmp_path: Path) -> None:
    saved = tmp_path / "cursor"
    args = ("--json", "--kind", "file", "--keepalive", "1", "--cursor-file", str(saved))
    first = _follow_cli(world, *args)
    out = _lines_of(first.stdout)
    try:
        # Its first line (a keep-alive, from now) is saved: the stream is open.
        deadline = time.monotonic() + 30
        while not saved.exists():
            assert time.monotonic() < deadline and first.poll() is None, "no cursor saved"
            time.sleep(0.05)
        assert saved.stat().st_mode & 0o777 == 0o600
        _write(world, "file.one", ["f1"])
        assert json.loads(_wait_for(out, 1, OWED_WITHIN)[0])["target"] == "f1"
    finally:
        _end(first)
    # Written while no follower runs: the next one starts where the last one was.
    _write(world, "file.two", ["f2"])
    second = _follow_cli(world, *args)
    out = _lines_of(second.stdout)
    try:
        assert json.loads(_wait_for(out, 1, OWED_WITHIN)[0])["target"] == "f2"
    finally:
        _end(second)


def test_the_cli_follows_and_resumes_through_a_server_restart(world: World, served: Served) -> None:
    """Last in the module: it restarts the server."""
    follow = _follow_cli(world, "--json", "--kind", "cli", "--keepalive", "1", "--after", "start")
    out, err = _lines_of(follow.stdout), _lines_of(follow.stderr)
    try:
        _write(world, "cli.one", ["a", "b"])
        got = [json.loads(line) for line in _wait_for(out, 2, OWED_WITHIN)]
        assert [e["target"] for e in got] == ["a", "b"]
        served.server.stop(timeout=30)
        # Written while no server is up: the CLI owes them once it is back.
        _write(world, "cli.two", ["c", "d"])
        # Meanwhile, a follower told to give up does, with where to resume.
        gave_up = _follow_cli(world, "--after", got[-1]["cursor"], "--give-up-after", "2")
        _, said = gave_up.communicate(timeout=60)
        assert gave_up.returncode == 1
        assert "no server answered for 2 s" in said and f"--after {got[-1]['cursor']}" in said
        served.server.start()
        _write(world, "cli.three", ["e"])
        more = [json.loads(line) for line in _wait_for(out, 3, OWED_WITHIN)]
        assert [e["target"] for e in more] == ["c", "d", "e"]
        follow.send_signal(signal.SIGINT)
        assert follow.wait(20) == 130
        said = "".join(iter(lambda: err.get(timeout=5) or "", ""))
        _end(follow)
        assert "ended the stream (this server is stopping" in said, said
        assert "trying again in" in said, said
        resume = re.search(r"resume with --after (\S+)", said)
        assert resume is not None, said
        assert position(resume.group(1)) >= position(more[-1]["cursor"])
    finally:
        _end(follow)


# --- the follower's own rules, with a fake stream ----------------------------------------


class FakeLines:
    def __init__(self, lines: list[bytes]) -> None:
        self.lines = lines

    def readline(self, limit: int) -> bytes:
        if not self.lines:
            raise TimeoutError
        return self.lines.pop(0)

    def close(self) -> None:
        pass


def _event(target: str, cursor: str) -> bytes:
    return json.dumps({"action": "a.b", "target": target, "cursor": cursor}).encode() + b"\n"


def test_the_follower_fails_over_drops_a_cut_line_and_resumes_from_its_cursor() -> None:
    opened: list[tuple[str, str]] = []
    shown: list[str] = []
    said: list[str] = []
    planned: list[FakeLines | Exception] = [
        Unreachable("s1: connection refused"),
        FakeLines([b'{"keepalive":true,"cursor":"c0"}\n', _event("x", "c1"), b'{"action":"a']),
        StreamRefused("too many", 429),
        FakeLines([_event("y", "c2"), b'{"end":"this server is stopping","cursor":"c3"}\n']),
        StreamRefused("operator gone", 403),
    ]  # fmt: skip
    answers = iter(planned)

    def open_(server: str, path: str, timeout: float) -> FakeLines:
        opened.append((server, path))
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    follower = Follower(
        open_, lambda: ["s1", "s2"], lambda e: shown.append(e["target"]), said.append,
        kinds=("a",), sleep=lambda _: None,
    )  # fmt: skip
    with pytest.raises(StreamRefused, match="operator gone"):
        follower.run()
    assert shown == ["x", "y"]  # the cut line dropped, sent again by the next stream
    assert [s for s, _ in opened] == ["s1", "s2", "s1", "s2", "s1"]
    assert "after" not in opened[1][1]
    assert "after=c1" in opened[2][1] and "after=c1" in opened[3][1]
    assert "after=c3" in opened[4][1] and "kind=a" in opened[4][1]
    assert any("the stream was cut off; resuming from cursor c1" in s for s in said), said
    assert any("refused the stream: too many" in s for s in said), said


def test_the_follower_gives_up_when_told_with_the_cursor_to_resume_from() -> None:
    clock = [0.0]

    def unreachable(server: str, path: str, timeout: float) -> FakeLines:
        raise Unreachable(f"{server}: connection refused")

    def sleep(seconds: float) -> None:
        clock[0] += seconds

    said: list[str] = []
    follower = Follower(
        unreachable, lambda: ["s1"], lambda e: None, said.append, cursor="c9",
        give_up_after=30, sleep=sleep, clock=lambda: clock[0],
    )  # fmt: skip
    with pytest.raises(Oz0Error, match=r"no server answered for 30 s .*resume with --after c9"):
        follower.run()
    # Backing off, each attempt said.
    assert said[0] == "audit follow: s1: connection refused; trying again in 0.5 s"
    assert "trying again in 10 s" in said[-1]
    assert 30 <= clock[0] <= 45
