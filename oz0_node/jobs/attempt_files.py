"""What the agent and an attempt's supervisor exchange, defined once for both sides (the
agent's handle, supervisor_client.py, and the supervisor's process, supervisor.py): the
attempt as the agent hands it over, and the files of the attempt's directory,
DATA_DIR/attempts/<job>-<n> (0700; supervisor.py's docstring says who writes what, and
when):

- `lock`: held (flock) by the supervisor for its whole life;
- `supervisor.json`: the supervisor's PID and start time ({"pid", "start_time"});
- `output`: the command's output, records of one byte (STDOUT 1, STDERR 2, or MARK|stream
  for the cap's mark), a 4-byte big-endian length, then that many bytes of data (at most
  RECORD_DATA); at most OUTPUT_CAP bytes of data;
- `tracking.json`: what is left to end if the supervisor is killed (isolation.AttemptRecord);
- `status.json`: how the attempt ended (`AttemptStatus`), once nothing of it is left;
- `supervisor.log`: the supervisor's own lines, at most LOG_CAP bytes.

Versions: an attempt's supervisor outlives its agent, so an upgraded agent reads what the
previous release's supervisor wrote (and a downgraded one what a later one wrote). A file
changes only by adding fields, which a reader of another version ignores; a change of what
a field means is a new file. `status.json` says its VERSION; one without is version 1,
written before VERSION was (the oldest lack `output_complete`: read as true), and read by a
compatibility branch (docs/architecture.md, "Compatibility branches").
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oz0_common.attempt_messages import AttemptResult, BadAttemptMessage
from oz0_node.jobs.isolation import ATTEMPTS_DIR, Isolation, Limits

# What a node keeps of an attempt's output (both streams together), and sends to the edge.
OUTPUT_CAP = 1 << 20
RECORD_DATA = 32 << 10
STDOUT, STDERR, MARK = 1, 2, 0x80
STREAM_CODES = {"stdout": STDOUT, "stderr": STDERR}
CODE_STREAMS = {code: name for name, code in STREAM_CODES.items()}
HEADER = struct.Struct(">BI")
LOG_CAP = 256 << 10

LOCK_FILE = "lock"
PID_FILE = "supervisor.json"
OUTPUT_FILE = "output"
TRACKING_FILE = "tracking.json"
STATUS_FILE = "status.json"
LOG_FILE = "supervisor.log"
ATTEMPT_DIR = re.compile(r"(job-[0-9a-f]{12})-([1-9][0-9]*)\Z")
# What the supervisor says to `launch` once it has started the command (or failed to).
READY = b"ready\n"

# status.json's format: 2 adds "version" (to version 1, which had none).
VERSION = 2
FIRST_VERSION = 1


def attempts_root(data_dir: Path) -> Path:
    """DATA_DIR/attempts: one directory per attempt, <job>-<n>."""
    return data_dir / ATTEMPTS_DIR


@dataclass(frozen=True)
class OutputRecord:
    stream: str  # "stdout" or "stderr"
    data: bytes
    truncated: bool = False  # the cap's mark (data b""): what came after was dropped


# --- status.json --------------------------------------------------------------------------


@dataclass(frozen=True)
class AttemptStatus:
    """DIR/status.json: the attempt has ended, nothing of it is left, DIR/output is complete.
    Its RESULT is what the node reports (`attempt_done`), field for field."""

    result: AttemptResult
    version: int = VERSION

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, **self.result.to_wire()}

    def encode(self) -> bytes:
        return (json.dumps(self.to_dict()) + "\n").encode()

    @classmethod
    def from_dict(cls, raw: object) -> AttemptStatus:
        """BadAttemptMessage (a ValueError) if RAW is not a status of any version."""
        if not isinstance(raw, dict):
            raise BadAttemptMessage("a status is an object")
        version = raw.get("version", FIRST_VERSION)
        if isinstance(version, bool) or not isinstance(version, int) or version < FIRST_VERSION:
            raise BadAttemptMessage(f"a status's version is a whole number, not {version!r}")
        return cls(AttemptResult.parse(raw), version)

    @classmethod
    def decode(cls, data: bytes) -> AttemptStatus:
        """ValueError if DATA is not JSON, or not a status."""
        return cls.from_dict(json.loads(data))


# --- the handover: the attempt, over the supervisor's stdin ----------------------------------


@dataclass(frozen=True)
class SupervisedSpec:
    """One attempt, as the agent hands it to its supervisor; never written to disk (ENV
    carries the opened secrets)."""

    node_id: str
    job_id: str
    attempt: int
    command: tuple[str, ...]
    # The job's environment with its opened secrets merged in: never in a repr.
    env: Mapping[str, str] = field(repr=False)
    timeout: float | None
    limits: Limits
    # Files to place in its working directory before the command starts (`job run
    # --file`): (name, path of the checked copy the agent staged).
    files: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return f"{self.job_id}-{self.attempt}"


def handover(spec: SupervisedSpec, isolation: Isolation, directory: Path, lock: int) -> bytes:
    """SPEC, with the agent's ISOLATION, the attempt's DIRECTORY and the number of its LOCK's
    descriptor in the supervisor: what `launch` writes to the supervisor's stdin."""
    limits = spec.limits
    raw = {
        "dir": str(directory),
        "lock_fd": lock,
        "node_id": spec.node_id,
        "job_id": spec.job_id,
        "attempt": spec.attempt,
        "command": list(spec.command),
        "env": dict(spec.env),
        "timeout": spec.timeout,
        "limits": {
            "memory": limits.memory,
            "cpu": limits.cpu,
            "max_processes": limits.max_processes,
            "max_open_files": limits.max_open_files,
            "address_space": limits.address_space,
            "unknown": list(limits.unknown),
        },
        "isolation": isolation.handed(),
        "files": [list(f) for f in spec.files],
    }
    return json.dumps(raw).encode()


def parse_handover(raw: dict[str, Any]) -> tuple[SupervisedSpec, Isolation, Path, int]:
    """The handover `launch` wrote (trusted: the agent's own, from the same code)."""
    limits = raw["limits"]
    isolation = Isolation.from_handed(raw["isolation"])
    timeout = raw["timeout"]
    command, env = raw["command"], raw["env"]
    spec = SupervisedSpec(
        node_id=str(raw["node_id"]),
        job_id=str(raw["job_id"]),
        attempt=int(raw["attempt"]),
        command=tuple(str(a) for a in command),
        env={str(k): str(v) for k, v in env.items()},
        timeout=float(timeout) if isinstance(timeout, int | float) else None,
        limits=Limits(
            memory=limits["memory"],
            cpu=limits["cpu"],
            max_processes=limits["max_processes"],
            max_open_files=limits["max_open_files"],
            address_space=limits["address_space"],
            unknown=tuple(limits["unknown"]),
        ),
        files=tuple((str(name), str(path)) for name, path in raw.get("files", [])),
    )
    return spec, isolation, Path(raw["dir"]), int(raw["lock_fd"])
