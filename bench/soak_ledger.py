"""The soak's ledger: what each command the workload ran did, as the node saw it (issue 44).

Every command of the workload is wrapped (`wrapped(command)`): a small shell script runs the
real command, copies what it printed on stdout to a file of the attempt's own, and appends
two lines to the ledger: `start` before the command (job, attempt, node, the wrapper's PID,
the time) and `end` after it (the same, the exit status, the SHA-256 and size of its
stdout). A command killed (a timeout, a cancel, its node's end) leaves its `start` alone.

Where: the ledger must be reachable from every attempt and read by the workload only.
Attempts run as UIDs of their own with a private /tmp and /var/tmp (oz0_node/jobs/
private_tmp.py), never with the agent's data directory, and their files in /dev/shm,
/run/lock and the like are swept when they end (uid_sweep.py). So it lives in a directory
of the run's own under /run (LEDGER_PARENT): the directory 0711 (anyone may pass through,
nobody but root list it), the script 0755, the ledger 0622 owned by root: any UID may open
it to append, only root (the workload) may read it. Each line is one write of far less
than PIPE_BUF on an O_APPEND file (the shell's `>>`), so lines of commands running side by
side never interleave.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LEDGER_PARENT = Path("/run")
PREFIX = "oz0soak-"

# The wrapper. `$d` is in the attempt's own working directory (its TMPDIR), gone with it.
# The exit status comes out of the pipeline through a file: POSIX sh has no pipefail.
SCRIPT = r"""#!/bin/sh
# The soak's wrapper (bench/soak_ledger.py): "$@" with its stdout digested, in the ledger.
L='{ledger}'
printf 'start\t%s\t%s\t%s\t%s\t%s\n' "$OZ0_JOB_ID" "$OZ0_ATTEMPT" "$OZ0_NODE_ID" "$$" \
  "$(date +%s.%N)" >> "$L"
d=$(mktemp -d) || exit 125
{{ "$@"; echo "$?" > "$d/rc"; }} | tee "$d/out"
rc=$(cat "$d/rc" 2>/dev/null || echo 125)
sum=$(sha256sum < "$d/out" 2>/dev/null | cut -d' ' -f1)
size=$(wc -c < "$d/out" 2>/dev/null)
printf 'end\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$OZ0_JOB_ID" "$OZ0_ATTEMPT" "$OZ0_NODE_ID" \
  "$$" "$(date +%s.%N)" "$rc" "${{sum:--}}" "${{size:--}}" >> "$L"
rm -rf "$d"
exit "$rc"
"""


@dataclass(frozen=True)
class Ledger:
    """A run's ledger directory: the wrapper at SCRIPT, the lines at PATH."""

    directory: Path

    @property
    def path(self) -> Path:
        return self.directory / "ledger"

    @property
    def script(self) -> Path:
        return self.directory / "run.sh"

    def wrapped(self, command: list[str]) -> list[str]:
        """COMMAND as the workload sends it: run by the wrapper."""
        return ["sh", str(self.script), *command]

    def read(self) -> str:
        return self.path.read_text() if self.path.exists() else ""


@contextlib.contextmanager
def ledger(parent: Path = LEDGER_PARENT) -> Iterator[Ledger]:
    """A new ledger in PARENT (modes as the module says), removed afterwards."""
    directory = parent / f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    directory.mkdir(mode=0o700)
    try:
        made = Ledger(directory)
        made.script.write_text(SCRIPT.format(ledger=made.path))
        made.script.chmod(0o755)
        # 0622: every attempt's UID appends, only the owner (root, the workload) reads.
        fd = os.open(made.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
        os.close(fd)
        made.path.chmod(0o622)
        directory.chmod(0o711)
        yield made
    finally:
        shutil.rmtree(directory, ignore_errors=True)
