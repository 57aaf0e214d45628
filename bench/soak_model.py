"""What the soak collected (issue 44), as values the checker reads (bench/soak_check.py):
the ledger's runs (bench/soak_ledger.py writes them on the nodes), the cluster's own
records of jobs, pushes, sessions and audit rows (bench/soak_records.py reads them), and
what the soak saw from outside (changes it made, blocks probed from the node's side,
process exits, fault spans, memory samples, database connections).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


class BadLedger(ValueError):
    pass


@dataclass(frozen=True)
class Run:
    """One command run, from its ledger lines: END and after are None if it never ended."""

    job: str
    attempt: int
    node: str
    pid: int
    start: float
    end: float | None = None
    status: int | None = None
    digest: str | None = None
    size: int | None = None


def read_ledger(text: str) -> list[Run]:
    """The runs of a ledger's TEXT, in the order they started. An `end` is matched to the
    `start` of the same job, attempt, node and PID."""
    runs: list[Run] = []
    open_runs: dict[tuple[str, int, str, int], int] = {}
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split("\t")
        try:
            if fields[0] == "start" and len(fields) == 6:
                key = (fields[1], int(fields[2]), fields[3], int(fields[4]))
                open_runs[key] = len(runs)
                runs.append(Run(*key, start=float(fields[5])))
            elif fields[0] == "end" and len(fields) == 9:
                key = (fields[1], int(fields[2]), fields[3], int(fields[4]))
                index = open_runs.pop(key)
                # The wrapper could not keep the output (its directory gone under it): "-".
                kept = fields[7] not in ("", "-") and fields[8].isdigit()
                runs[index] = Run(
                    *key, start=runs[index].start, end=float(fields[5]),
                    status=int(fields[6]), digest=fields[7] if kept else None,
                    size=int(fields[8]) if kept else None,
                )  # fmt: skip
            else:
                raise BadLedger(f"ledger line {number}: {line[:200]!r}")
        except (ValueError, KeyError) as e:
            raise BadLedger(f"ledger line {number}: {line[:200]!r} ({e})") from None
    return runs


@dataclass(frozen=True)
class AttemptRecord:
    """An attempt as the cluster records it, with the SHA-256 of its stored stdout."""

    number: int
    part: int
    node: str
    state: str
    exit_code: int | None
    ended_because: str | None
    truncated: bool = False
    stdout_sha256: str | None = None
    stdout_bytes: int = 0


@dataclass(frozen=True)
class JobRecord:
    id: str
    state: str
    # By when (wall clock) it must have ended, from what the workload asked of it.
    bound: float
    attempts: tuple[AttemptRecord, ...] = ()
    # The minute of the soak it was made in (for the report).
    minute: float = 0.0
    # The SHA-256 of what its command prints, if known beforehand (`job run --file`).
    expect: str | None = None
    # Whether its command runs under the ledger (a push's is the agent's own).
    ledgered: bool = True


@dataclass(frozen=True)
class PushedFile:
    """A node's part of a push: what its agent reported (written, unchanged, error: ...),
    and the SHA-256 of the file the soak found at its destination (None: none there)."""

    node: str
    attempt: int
    result: str
    found: str | None


@dataclass(frozen=True)
class PushRecord:
    job: str
    minute: float
    sha256: str
    nodes: tuple[PushedFile, ...] = ()


@dataclass(frozen=True)
class SessionRecord:
    """A session: what the soak was shown over its websocket, and the cluster's record of
    it (how it ended, its recording's output; None: not read)."""

    id: str
    node: str
    minute: float
    received: bytes = b""
    exit_code: int | None = None
    live: bool = False
    recorded: bytes | None = None


@dataclass(frozen=True)
class Change:
    """Something the workload changed that the API accepted: the audit row it expects."""

    action: str
    target: str
    minute: float


@dataclass(frozen=True)
class BlockProbe:
    """A block seen from its node: from the API's answer to its stream refused `blocked`
    (seconds; None: never within the probe's watch), and from the request to the answer;
    and from the answer to each server's Temporal refusing the node's calls."""

    node: str
    minute: float
    took: float | None
    asked: float = 0.0
    # Why it is not judged (its node's stream was on a server a fault stopped), if so.
    exempt: str | None = None
    # (server, seconds from the answer to its Temporal's first refusal; None: never) for
    # each server judged: not one a fault stopped, paused, or whose host it killed.
    temporal: tuple[tuple[str, float | None], ...] = ()

    @property
    def effect(self) -> float | None:
        """When the block had taken effect everywhere: the latest of the stream's refusal
        and every server's Temporal's; None if one never came."""
        times = [self.took, *(t for _, t in self.temporal)]
        return None if None in times else max(t for t in times if t is not None)

    def late(self) -> str:
        """What came last (or never), for the violation."""
        parts = ["stream " + ("never" if self.took is None else f"{self.took:.2f} s")]
        parts += [
            f"Temporal on {server} " + ("never" if t is None else f"{t:.2f} s")
            for server, t in self.temporal
        ]
        return ", ".join(parts)


@dataclass(frozen=True)
class Exit:
    """A process of the cluster that exited, and whether a fault meant it to."""

    name: str
    minute: float
    code: int | None
    planned: bool


@dataclass(frozen=True)
class HostExit:
    """A server's Temporal host (by its PID) seen gone while its server ran on."""

    server: str
    pid: int
    minute: float


@dataclass(frozen=True)
class FaultSpan:
    """A fault injected: its kind, its target (a server's address, "postgres", an agent)
    and when it began and ended (minutes of the run)."""

    kind: str
    target: str
    start: float
    end: float


@dataclass(frozen=True)
class Sample:
    """One reading of a process's RSS (MiB) at a minute of the run."""

    name: str
    pid: int
    minute: float
    rss_mib: float


@dataclass(frozen=True)
class Violation:
    kind: str
    minute: float
    detail: str

    def to_json(self, seed: int) -> dict[str, Any]:
        return {**asdict(self), "minute": round(self.minute, 2), "seed": seed}


@dataclass
class Records:
    """Everything the checker compares."""

    runs: list[Run]
    jobs: list[JobRecord]
    audit: set[tuple[str, str]] = field(default_factory=set)
    changes: list[Change] = field(default_factory=list)
    blocks: list[BlockProbe] = field(default_factory=list)
    pushes: list[PushRecord] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    host_exits: list[HostExit] = field(default_factory=list)
    faults: list[FaultSpan] = field(default_factory=list)
    rss: list[Sample] = field(default_factory=list)
    # (minute, connections) readings, and their bound.
    connections: list[tuple[float, int]] = field(default_factory=list)
    connection_bound: int = 0
    # The run's length (minutes), and when the check ran (wall clock, and its minute).
    minutes: float = 0.0
    checked_at: float = 0.0
    started_at: float = 0.0
