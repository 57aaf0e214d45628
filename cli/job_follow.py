"""Printing a job's output as it comes, from pages of GET /api/v1/jobs/<id>/output.

The loop takes the page fetch as a plain callable (cursor, wait, seen -> page), so it is
tested with recorded pages; `job run` and `job logs` give it one that calls the API.

Following is told, not polled: once it has a page, each fetch asks the server to WAIT for
news (output, the job's end, or a change of the job since the version it was shown) and
the server answers as soon as there is some (oz0/jobs/follow.py), so the command exits as
the job ends. A server that did not wait (one older than `wait`, or one stopping) is asked
again after POLL_INTERVAL.

The command's stdout and stderr are written as raw bytes to our stdout and stderr, so
`job run ... > file` holds exactly what the command printed. Everything we add (attempt
headers, the truncation mark) goes to stderr, through the same binary stream as the
command's stderr so the two keep their order.
"""

from __future__ import annotations

import base64
import binascii
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Protocol

from cli.output import terminal_safe
from oz0.errors import Oz0Error
from oz0.jobs.end_reasons import EndReason

POLL_INTERVAL = 0.3
# Seconds a server may hold a fetch while there is no news (at most its limit, 20); the
# client's read deadline outlasts it (job_cmds).
FOLLOW_WAIT = 10
ENDED_STATES = ("succeeded", "failed", "cancelled", "lost")

FetchPage = Callable[[int, int, str | None], dict[str, Any]]
"""Fetch the output page after CURSOR (0: from the start); the server may wait up to WAIT
seconds (0: answer at once) for news since the job's version SEEN (None: none shown)."""


class BadOutput(Oz0Error):
    pass


class Sink(Protocol):
    """Where a follower's output goes when it is laid out rather than written as it comes
    (cli/job_view.py: `job run --output`, the live line)."""

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> None: ...

    def note(self, text: str, attempt: int | None = None) -> None: ...

    def page(self, job: dict[str, Any], *, caught_up: bool) -> None: ...


@dataclass
class Follower:
    """Write a job's chunks to OUT and ERR; `run` until caught up, or until the job ends.

    headers: "moves" (`job run`: nothing before the first attempt's output, a header when
    the attempt changes, naming why the last one ended) or "always" (`job logs`: every
    attempt headed, the first too). `--all` jobs run their attempts side by side, so their
    headers name only the attempt and its node; none at all with node_headers false (an
    output laid out by node names each node already).

    sink: where output and our lines go instead of OUT and ERR, and each page's job.
    """

    fetch: FetchPage
    out: BinaryIO
    err: BinaryIO
    headers: str = "moves"
    only_attempt: int | None = None
    sleep: Callable[[float], None] = time.sleep
    interval: float = POLL_INTERVAL
    wait: int = FOLLOW_WAIT
    sink: Sink | None = None
    node_headers: bool = True
    cursor: int = 0
    job: dict[str, Any] = field(default_factory=dict)
    _shown: int | None = None
    _waiting: str | None = None
    # The job's version as the last page gave it (None: not yet, or an older server).
    _seen: str | None = None

    def run(self, *, follow: bool) -> dict[str, Any]:
        """The job object once its output is complete (follow) or caught up (not follow)."""
        while True:
            # The first fetch answers at once: until then, everything is news.
            wait = self.wait if follow and self._seen is not None else 0
            page = self.fetch(self.cursor, wait, self._seen)
            chunks = page.get("chunks") or []
            self.job = page["job"]
            version = page.get("version")
            self._seen = version if isinstance(version, str) else None
            for chunk in chunks:
                self._write(chunk)
            if page.get("cursor") is not None:
                self.cursor = int(page["cursor"])
            if self.sink is not None:
                # Caught up with the output stored when the job was read: the page held
                # all there was (a server older than `more`: an empty page says so).
                more = page.get("more")
                self.sink.page(self.job, caught_up=more is False or (more is None and not chunks))
            if chunks:
                continue  # there may be more right away
            # Caught up: the output of an ended job is complete once a page is empty.
            if page.get("ended") or not follow:
                return self.job
            self._announce_newest()
            self._announce_waiting()
            # Asked at once, a server that gives versions waits when asked next; asked
            # to wait, one that did not (stopping, or older than `wait`) is given a rest.
            told = page.get("waited") is True if wait else self._seen is not None
            if not told:
                self.sleep(self.interval)

    def _write(self, chunk: dict[str, Any]) -> None:
        attempt = int(chunk["attempt"])
        if attempt != self._shown:
            self._header(attempt, chunk.get("node"))
        try:
            data = base64.b64decode(chunk["data"], validate=True)
        except (binascii.Error, TypeError, ValueError):
            raise BadOutput(
                f"the server sent output of job {self._job_id()} that is not base64"
            ) from None
        stream = "stdout" if chunk["stream"] == "stdout" else "stderr"
        if self.sink is not None:
            self.sink.output(attempt, str(chunk.get("node")), stream, data)
        elif data:
            target = self.out if stream == "stdout" else self.err
            target.write(data)
            target.flush()
        if chunk.get("truncated"):
            self._line(
                f"--- output of attempt {attempt} truncated: it passed the cap of 1 MiB"
                " per attempt, the rest was dropped",
                attempt,
            )

    def _announce_newest(self) -> None:
        """Name a new attempt as soon as it appears, before it prints anything."""
        if self.only_attempt is not None or self.job.get("all"):
            return
        attempts = self.job.get("attempts") or []
        if not attempts:
            return
        newest = attempts[-1]
        number = int(newest["number"])
        if self._shown is None and self.headers == "moves" and number == 1:
            self._shown = 1  # the first attempt of `job run`: stdout stays the command's
            return
        if self._shown is None or number > self._shown:
            self._header(number, newest.get("node"))

    def _announce_waiting(self) -> None:
        """Say once why a job waits for a node (and again if the reason changes)."""
        reason = self.job.get("reason") if self.job.get("state") == "queued" else None
        if reason and reason != self._waiting:
            self._line(f"--- job {self._job_id()} queued: {reason}")
        self._waiting = reason

    def _header(self, attempt: int, node: object) -> None:
        previous, self._shown = self._shown, attempt
        if self.headers == "moves" and previous is None and attempt == 1:
            return
        if self.job.get("all") and not self.node_headers:
            return
        line = f"--- attempt {attempt} on {node}"
        if self.job.get("all"):
            pass  # side by side: no attempt ended to make room for this one
        elif self.headers == "moves":
            if attempt > 1 and (previous is None or previous < attempt):
                line += f" (attempt {attempt - 1} {_ended(self._attempt(attempt - 1))})"
        elif self._attempt(attempt).get("state") == "ended":
            line += f" ({_ended(self._attempt(attempt))})"
        self._line(line)

    def _attempt(self, number: int) -> dict[str, Any]:
        for attempt in self.job.get("attempts") or []:
            if attempt.get("number") == number:
                return dict(attempt)
        return {}

    def _line(self, text: str, attempt: int | None = None) -> None:
        if self.sink is not None:
            self.sink.note(text, attempt)
            return
        self.err.write((terminal_safe(text) + "\n").encode())
        self.err.flush()

    def _job_id(self) -> str:
        return str(self.job.get("id", "?"))


def _ended(attempt: dict[str, Any]) -> str:
    because = attempt.get("ended_because")
    if because is None:
        return "ended"
    if because == EndReason.EXIT:
        return f"ended: exit code {attempt.get('exit_code')}"
    return f"ended: {because}"


def outcome(job: dict[str, Any]) -> tuple[int, str | None]:
    """The exit code for an ended job, and the line to print on stderr (None: none).

    The command's own exit code when it has one (a `--all` job: the job's exit_code; with
    a line saying why if a rolling batch left parts unstarted); any other end (lost,
    cancelled, timeout, queue timeout, failed before it could run) is 1 with a line naming
    the job and why.
    """
    state = job.get("state")
    code = job.get("exit_code")
    if state in ("succeeded", "failed") and isinstance(code, int):
        # A rolling batch stopped by its failures: say how many parts it never started.
        stopped = (job.get("parts") or {}).get("not_started")
        line = (
            terminal_safe(f"job {job.get('id')} failed: {job.get('reason')}") if stopped else None
        )
        return (code if 0 <= code <= 255 else 1), line
    if state == "succeeded":
        return 0, None
    reason = job.get("reason") or _last_ended_because(job) or "no reason given"
    return 1, terminal_safe(f"job {job.get('id')} {state}: {reason}")


def _last_ended_because(job: dict[str, Any]) -> str | None:
    attempts = job.get("attempts") or []
    because = attempts[-1].get("ended_because") if attempts else None
    return str(because) if because else None
