"""The soak's workload (issue 44): what users and operators do, drawn from a seed. Pure:
each draw is a job's API body (its command not yet wrapped by the ledger) with the bound
it must end by, or an operator's action; the soak (bench/soak_send.py) sends them.

Every command prints a few numbered lines on stdout (what the ledger digests) and says
how it ends by its text alone: the job's and attempt's numbers come from the node's
environment (OZ0_JOB_ID, OZ0_ATTEMPT), so a command that is started again prints what
its first run printed.

Hooks: file pushes (`job run --file`, `file push`) and sessions land on other branches;
ACTIONS names them (`file_push`, `session`) with weight 0, and `draw` refuses a weight
for a kind it cannot make.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

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
    # Hooks for what other branches bring: drawn once their weight is set.
    "file_push": 0, "session": 0,
}  # fmt: skip
MADE = {"single", "retried", "all", "batch", "timeout", "cancel", "on_lost", "secret",
        "limits", "block", "purge", "person"}  # fmt: skip


def lines(count: int, *, pause: float = 1.0, tail: str = "") -> str:
    """COUNT numbered lines, PAUSE seconds apart, then TAIL (shell text)."""
    body = (
        f'i=1; while [ "$i" -le {count} ]; do echo "$OZ0_JOB_ID.$OZ0_ATTEMPT line $i";'
        f" i=$((i + 1)); sleep {pause}; done"
    )
    return f"{body}; {tail}" if tail else body


@dataclass(frozen=True)
class JobPlan:
    kind: str
    body: dict[str, Any]  # the API's job, its `command` the real one (wrap before sending)
    # Seconds after submission by which it must have ended.
    bound: float
    cancel_after: float | None = None
    secret: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class Action:
    """An operator's action: KIND on a target the soak chooses, held HOLD seconds (a
    block until its unblock, a person until removed)."""

    kind: str
    hold: float


def draw(rng: random.Random, nodes: int, weights: dict[str, int] = ACTIONS) -> JobPlan | Action:
    """One thing to do. NODES: how many nodes the fleet has (an --all job's size)."""
    unknown = [k for k, w in weights.items() if w and k not in MADE]
    if unknown:
        raise ValueError(f"the workload cannot make {unknown} yet")
    kinds = [k for k, w in weights.items() if w]
    kind = rng.choices(kinds, [weights[k] for k in kinds])[0]
    if kind in ("block", "purge", "person"):
        return Action(kind, rng.uniform(5.0, 20.0))
    return job(rng, kind, nodes)


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
    else:
        raise ValueError(f"no job of kind {kind}")
    body["command"] = ["sh", "-c", text]
    body["name"] = f"soak {kind}"
    return JobPlan(kind, body, bound, cancel_after, secret)
