"""What `job run` shows of a job it follows, when more than its bytes: the output laid out
by its mode (cli/job_lines.py), the live line of where the parts are (cli/job_recap.py),
both through one screen (cli/job_screen.py). The follower (cli/job_follow.py) hands it
each piece of output, each of its own lines, and each page's job.

An attempt's held output (a line not yet whole, a `grouped` block) is let out once the
attempt has ended and a page has caught up with the output stored by then: the server
reads the job before the output, and a node stores its last output before its attempt can
end, so that page holds the last of it.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from cli.job_lines import Dropped, Lines, lines_for
from cli.job_recap import describe, progress_line, tally
from cli.job_screen import LINES, LIVE, OFF, Screen, columns_of, is_terminal


@dataclass(frozen=True)
class Shown:
    """How a followed `job run` shows its job: OUTPUT's layout, the live line (STATUS: LIVE
    on a terminal, LINES when asked elsewhere, or OFF), the RECAP in text, or as JSON."""

    output: str
    status: str
    recap: bool
    json: bool

    @classmethod
    def of(cls, output: str, progress: bool | None, json: bool, *, many: bool) -> Shown:
        """PROGRESS None: the live line and the recap for a job on MANY nodes when stderr
        is a terminal, as Salt and Ansible show theirs."""
        on_terminal = is_terminal(sys.stderr)
        wanted = (many and on_terminal) if progress is None else progress
        status = OFF if not wanted else LIVE if on_terminal else LINES
        return cls(output, status, recap=wanted and not json, json=json)

    @property
    def plain(self) -> bool:
        """As before any of this: the bytes as they come, nothing added (no View)."""
        return self.output == "raw" and self.status == OFF and not self.json

    def view(self, job_id: str) -> View:
        """The view on our own stdout and stderr."""
        lines = Dropped() if self.json else lines_for(self.output)
        screen = Screen(
            sys.stdout.buffer,
            sys.stderr.buffer,
            status=self.status,
            out_on_terminal=is_terminal(sys.stdout),
            columns=columns_of(sys.stderr.buffer),
        )
        return View(job_id, lines, screen)


class View:
    def __init__(self, job_id: str, lines: Lines, screen: Screen) -> None:
        self.job_id = job_id
        self.lines = lines
        self.screen = screen
        self._closed: set[int] = set()  # the attempts whose end was given to LINES

    def output(self, attempt: int, node: str, stream: str, data: bytes) -> None:
        self.screen.write(self.lines.output(attempt, node, stream, data))

    def note(self, text: str, attempt: int | None = None) -> None:
        self.screen.write(self.lines.note(text, attempt))

    def page(self, job: dict[str, Any], *, caught_up: bool) -> None:
        if caught_up:
            for attempt in job.get("attempts") or []:
                number = int(attempt["number"])
                if attempt.get("state") == "ended" and number not in self._closed:
                    self._closed.add(number)
                    node = str(attempt.get("node"))
                    self.screen.write(self.lines.ended(number, node, describe(attempt)))
        if self.screen.mode != OFF:
            self.screen.status(progress_line(self.job_id, tally(job)))

    def stop(self, *, flush: bool = True) -> None:
        """Following has stopped: what is held is let out (unless FLUSH is false: our stdout
        is gone), and the live line wiped."""
        try:
            if flush:
                self.screen.write(self.lines.finish())
        finally:
            self.screen.clear()
