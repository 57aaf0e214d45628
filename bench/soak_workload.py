"""The soak's workload (issue 44): what users and operators do, drawn from a seed. Pure:
each draw is a job's API body (its command not yet wrapped by the ledger) with the bound
it must end by, or an operator's action; the soak (bench/soak_send.py) sends them.

Every command prints a few numbered lines on stdout (what the ledger digests) and says
how it ends by its text alone: the job's and attempt's numbers come from the node's
environment (OZ0_JOB_ID, OZ0_ATTEMPT), so a command that is started again prints what
its first run printed.

Files and sessions: a `job_file` job (`job run --file`) has a file of seeded content
placed in its working directory and prints the file's SHA-256 alone (its output known
beforehand: `expect`); a `file_push` job (`file push`) writes one to every node of a
group, under a name of its own in each agent's files/ directory; a `session` opens a
session on a node and runs a command there (bench/soak_sessions.py).
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Any

from oz0_common.file_push import PushOrder

QUEUE_TIMEOUT = 120.0
# Past a job's own worst case: the faults' recovery (a server's restart, lost nodes found)
# and the moves it may make.
MARGIN = 180.0
SECRET_NAME = "SOAK_SECRET"
# Every agent carries the label GROUP_LABEL=i % GROUPS: an --all job selects one group, so
# that a fleet of 100 runs fan-outs of 20, not of 100, and selectors are used.
GROUP_LABEL = "soak-group"
GROUPS = 5

# What the workload does, and how often (relative weights).
ACTIONS: dict[str, int] = {
    "single": 30, "retried": 8, "all": 5, "batch": 5, "timeout": 4, "cancel": 5,
    "on_lost": 10, "secret": 5, "limits": 5,
    "block": 5, "purge": 1, "person": 3,
    "job_file": 4, "file_push": 4, "session": 4,
}  # fmt: skip
# The sizes of the files pushed and placed: a byte, a page, many of the store's 32 KiB
# rows, and more than one upload request (1 MiB) and than a node's 256 KiB pieces.
FILE_SIZES = (1, 4096, 100_000, 1_100_000)


def lines(count: int, *, pause: float = 1.0, tail: str = "") -> str:
    """COUNT numbered lines, PAUSE seconds apart, then TAIL (shell text)."""
    body = (
        f'i=1; while [ "$i" -le {count} ]; do echo "$OZ0_JOB_ID.$OZ0_ATTEMPT line $i";'
        f" i=$((i + 1)); sleep {pause}; done"
    )
    return f"{body}; {tail}" if tail else body


@dataclass(frozen=True)
class Content:
    """A file's content, made from SEED: SIZE bytes, named NAME."""

    seed: int
    size: int
    name: str

    def data(self) -> bytes:
        return random.Random(self.seed).randbytes(self.size)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data()).hexdigest()


@dataclass(frozen=True)
class JobPlan:
    kind: str
    # The API's job, its `command` the real one (the soak wraps it before sending, but a
    # push's: the agent runs that itself).
    body: dict[str, Any]
    # Seconds after submission by which it must have ended.
    bound: float
    cancel_after: float | None = None
    secret: str | None = field(default=None, repr=False)
    # The file it places or pushes (stored in the cluster before the job is sent).
    file: Content | None = None
    # What its command prints, if known beforehand.
    expect: bytes | None = None

    @property
    def ledgered(self) -> bool:
        """Whether its command runs under the ledger (a push's is the agent's own)."""
        return self.kind != "file_push"


@dataclass(frozen=True)
class SessionPlan:
    """A session on a node the soak picks, running COMMAND (not yet wrapped) without a
    terminal, to end within BOUND seconds."""

    kind: str
    command: list[str]
    bound: float


@dataclass(frozen=True)
class Action:
    """An operator's action: KIND on a target the soak chooses, held HOLD seconds (a
    block until its unblock, a person until removed)."""

    kind: str
    hold: float


def draw(
    rng: random.Random, nodes: int, weights: dict[str, int] = ACTIONS
) -> JobPlan | Action | SessionPlan:
    """One thing to do. NODES: how many nodes the fleet has (an --all job's size)."""
    unknown = [k for k, w in weights.items() if w and k not in ACTIONS]
    if unknown:
        raise ValueError(f"the workload cannot make {unknown}")
    kinds = [k for k, w in weights.items() if w]
    kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
    if kind in ("block", "purge", "person"):
        return Action(kind, rng.uniform(5.0, 20.0))
    if kind == "session":
        # Its lines a little apart: output recorded in several chunks, and while a fault
        # may hit its node or server.
        count = rng.randint(1, 8)
        return SessionPlan(kind, ["sh", "-c", lines(count, pause=0.5)], count * 0.5 + 60.0)
    return job(rng, kind, nodes)


def content(rng: random.Random) -> Content:
    seed = rng.getrandbits(64)
    return Content(seed, rng.choice(FILE_SIZES), f"soak-{seed:016x}.bin")


def job(rng: random.Random, kind: str, nodes: int) -> JobPlan:
    count = rng.randint(1, 8)
    body: dict[str, Any] = {"tenant": "default", "queue_timeout": QUEUE_TIMEOUT}
    own = count + 30.0  # one attempt, with its start and its end's report
    bound = QUEUE_TIMEOUT + own + MARGIN
    cancel_after = None
    secret = None
    if kind == "single":
        text = lines(count)
    elif kind == "retried":
        # Attempt 1 fails, attempt 2 ends 0.
        text = lines(count, tail='[ "$OZ0_ATTEMPT" -ge 2 ] || exit 1')
        body["retries"] = 2
        bound += 2 * own
    elif kind == "all":
        text = lines(count)
        body.update(all=True, selector={GROUP_LABEL: str(rng.randrange(GROUPS))})
    elif kind == "batch":
        # About a quarter of the nodes fail (their ID's last hex digit).
        text = lines(count, tail='case "$OZ0_NODE_ID" in *[0-3]) exit 1;; esac')
        size = rng.choice(["2", "3", "25%"])
        body.update(all=True, batch=size, max_failures=rng.choice(["1", "2", "50%"]))
        body["selector"] = {GROUP_LABEL: str(rng.randrange(GROUPS))}
        group = -(-nodes // GROUPS)
        at_once = 2 if size == "2" else 3 if size == "3" else max(1, group // 4)
        bound += own * (group // at_once + 1)
    elif kind == "timeout":
        text = lines(60)
        body["timeout"] = rng.uniform(2.0, 6.0)
    elif kind == "cancel":
        text = lines(60)
        cancel_after = rng.uniform(1.0, 8.0)
    elif kind == "on_lost":
        text = lines(count * 2)
        on_lost = rng.choice(["move", "wait", "fail"])
        body.update(on_lost=on_lost, lost_after=rng.choice([5.0, 10.0, 20.0]))
        bound += own
    elif kind == "secret":
        secret = f"s3cret-{rng.getrandbits(64):016x}"
        text = lines(count, tail=f'echo "secret length ${{#{SECRET_NAME}}}"')
        body["secret_env"] = {SECRET_NAME: secret}
    elif kind == "limits":
        text = lines(count)
        body["limits"] = {"memory": 256 * 2**20, "max_processes": 64, "max_open_files": 1024}
    elif kind == "job_file":
        placed = content(rng)
        sha256 = placed.sha256
        body["files"] = [{"sha256": sha256, "size": placed.size, "name": placed.name}]
        body.update(command=["sh", "-c", f"sha256sum < {placed.name} | cut -d' ' -f1"])
        body["name"] = f"soak {kind}"
        return JobPlan(kind, body, bound, file=placed, expect=f"{sha256}\n".encode())
    elif kind == "file_push":
        # To every node of a group: each node's file is read back after the job ends.
        pushed = content(rng)
        order = PushOrder(pushed.sha256, pushed.size, pushed.name)
        body.update(all=True, selector={GROUP_LABEL: str(rng.randrange(GROUPS))})
        body.update(command=order.command(), name=f"soak {kind}")
        return JobPlan(kind, body, bound, file=pushed)
    else:
        raise ValueError(f"no job of kind {kind}")
    body["command"] = ["sh", "-c", text]
    body["name"] = f"soak {kind}"
    return JobPlan(kind, body, bound, cancel_after, secret)
