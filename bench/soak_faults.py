"""The soak's fault schedule (issue 44): drawn from a seed, printed before the run so that a
failure replays, and at most two faults at once: one on the control plane (a server, a
Temporal host, PostgreSQL) and one on a node. Pure: the soak (bench/scenarios/soak.py)
injects them.

Each kind, and what "ends" it:
- `server_kill`: SIGKILL of a server and its Temporal host (a machine that dies); started
  again after `hold` seconds.
- `server_term`: SIGTERM (the graceful drain); started again once it has exited, after
  `hold`.
- `temporal_host_kill`: SIGKILL of a server's Temporal host only (its server starts a new
  one).
- `server_pause`: SIGSTOP of a server for `hold` seconds (5-20), then SIGCONT.
- `postgres_restart`: PostgreSQL stopped (fast), started again after `hold`.
- `postgres_terminate`: every client backend terminated (what a failover does).
- `agent_kill`: kill -9 of an agent, started again on its data directory after `hold`.
- `agent_pause`: SIGSTOP of an agent for `hold` seconds (5-20), then SIGCONT.
- `disk_full`: the data directory of the agent on a small tmpfs filled for `hold` seconds.
- `net_cut`: a node's network cut for `hold` seconds (5-60) in its network namespace
  (bench/soak_netns.py): its link down, nearly every packet lost, or a crawling link.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

CONTROL_PLANE = ("server_kill", "server_term", "temporal_host_kill", "server_pause",
                 "postgres_restart", "postgres_terminate")  # fmt: skip
NODE = ("agent_kill", "agent_pause", "disk_full", "net_cut")
KINDS = CONTROL_PLANE + NODE
# Seconds each kind holds its fault (drawn uniformly).
HOLD = {
    "server_kill": (2.0, 15.0), "server_term": (1.0, 10.0), "temporal_host_kill": (0.0, 0.0),
    "server_pause": (5.0, 20.0), "postgres_restart": (0.0, 10.0),
    "postgres_terminate": (0.0, 0.0), "agent_kill": (0.0, 5.0), "agent_pause": (5.0, 20.0),
    "disk_full": (10.0, 30.0), "net_cut": (5.0, 60.0),
}  # fmt: skip
# Time for the cluster to come back from a fault before the next on the same side: a
# server's start, its nodes' reconnection.
RECOVER = {"server_kill": 25.0, "server_term": 25.0, "temporal_host_kill": 15.0,
           "postgres_restart": 15.0}  # fmt: skip
DEFAULT_RECOVER = 8.0


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the soak's start
    kind: str
    target: int  # which server or agent, by index
    hold: float

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "at": round(self.at, 1), "hold": round(self.hold, 1)}


def plan(
    seed: int,
    seconds: float,
    servers: int,
    agents: int,
    *,
    kinds: tuple[str, ...] = KINDS,
    warmup: float = 20.0,
    quiet_end: float = 30.0,
    gap: tuple[float, float] = (5.0, 25.0),
) -> list[Fault]:
    """The faults of a run of SECONDS, from SEED: each side (control plane, node) draws its
    next kind from a shuffled cycle of its kinds (a short run still sees many), waits GAP
    after the last fault of its side recovered, and none starts in the first WARMUP or the
    last QUIET_END seconds. Sorted by start."""
    rng = random.Random(seed)
    faults: list[Fault] = []
    for side in (CONTROL_PLANE, NODE):
        cycle: list[str] = []
        at = warmup + rng.uniform(*gap)
        while True:
            if not cycle:
                cycle = [k for k in side if k in kinds]
                if not cycle:
                    break
                rng.shuffle(cycle)
            kind = cycle.pop()
            hold = rng.uniform(*HOLD[kind])
            ends = at + hold + RECOVER.get(kind, DEFAULT_RECOVER)
            if ends > seconds - quiet_end:
                break
            count = servers if kind in CONTROL_PLANE else agents
            faults.append(Fault(at, kind, rng.randrange(count), hold))
            at = ends + rng.uniform(*gap)
    return sorted(faults, key=lambda f: f.at)
