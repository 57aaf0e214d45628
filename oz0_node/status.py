"""DIR/status.json: what the running agent reports about itself, for `oz0-node status`.

The agent rewrites it (atomically) on every change; `status` adds whether the agent is still
running (its pid is alive and DIR/agent.lock is held), so a dead agent never shows as
connected.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass
from pathlib import Path

from oz0_common import certs
from oz0_common.files import write_private
from oz0_node.errors import AgentError
from oz0_node.identity import IdentityDir

STATUS_FILE = "status.json"


@dataclass(frozen=True)
class Status:
    node_id: str | None
    cluster: str
    state: str
    connected: bool
    server: str | None
    runtime: str = "stopped"
    pid: int | None = None
    updated_at: str | None = None
    # {"job_user": NAME, "tracking": "cgroup v2 PATH" | "subreaper" | "process group",
    #  "max_jobs": N, "not_run": why no attempt runs and how to repair it, if none can}
    jobs: dict[str, object] | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "cluster": self.cluster,
            "state": self.state,
            "connected": self.connected,
            "server": self.server,
            "runtime": self.runtime,
            "pid": self.pid,
            "updated_at": self.updated_at,
            "jobs": self.jobs,
        }


def status_path(data_dir: Path) -> Path:
    return data_dir / STATUS_FILE


def write(data_dir: Path, status: Status) -> None:
    stamped = Status(
        node_id=status.node_id,
        cluster=status.cluster,
        state=status.state,
        connected=status.connected,
        server=status.server,
        runtime=status.runtime,
        jobs=status.jobs,
        pid=os.getpid(),
        updated_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
    )
    data = json.dumps(stamped.to_json(), indent=2) + "\n"
    try:
        write_private(status_path(data_dir), data.encode())
    except OSError as e:
        raise AgentError(f"cannot write {status_path(data_dir)}: {e.strerror or e}") from None


def expired_message(node_name: str, data_dir: Path, not_after: dt.datetime) -> str:
    """What an expired node certificate means, and what to do about it."""
    return (
        f"the certificate of node {node_name} expired at {not_after.isoformat()}, so the "
        f"cluster refuses it and cannot renew it: ask an operator to run `orchestrator-zero "
        f"node delete {node_name}`, then join again from a new --data-dir (move {data_dir} "
        "away) with a join token (--token-file or OZ0_JOIN_TOKEN)"
    )


def certificate_report(
    identity: IdentityDir, node_name: str, now: dt.datetime | None = None
) -> dict[str, object] | None:
    """The node certificate's validity, when to renew it, and whether it has expired."""
    if not identity.has_certificate():
        return None
    cert = identity.load_certificate()
    now = now or certs.utcnow()
    not_after = cert.not_valid_after_utc
    expired = now >= not_after
    return {
        "not_after": not_after.isoformat(),
        "renew_from": certs.renewal_point(cert, certs.NODE_RENEW_AT).isoformat(),
        "expired": expired,
        "advice": expired_message(node_name, identity.data_dir, not_after) if expired else None,
    }


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def read(data_dir: Path) -> dict[str, object]:
    """The status to show: the agent's report when there is one, else what node.json says."""
    identity = IdentityDir(data_dir)
    record = identity.load_record()
    if record is None and identity.has_flat_layout():
        raise AgentError(
            f"{data_dir} holds a node identity in the old flat layout; run "
            f"`oz0-node start --data-dir {data_dir}` once to move it into {identity.root}"
        )
    if record is None:
        raise AgentError(f"{data_dir} holds no node identity")
    path = status_path(data_dir)
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raw = None
    except (OSError, ValueError) as e:
        raise AgentError(f"cannot read {path}: {e}") from None
    if not isinstance(raw, dict):
        raw = {}
    pid = raw.get("pid")
    # The lock tells a live agent from an unrelated process that got its pid.
    running = isinstance(pid, int) and pid_alive(pid) and identity.lock_held() is not False
    state = raw.get("state")
    node_id = raw.get("node_id", record.node_id)
    return {
        "node_id": node_id,
        "cluster": raw.get("cluster", record.cluster),
        "state": state if isinstance(state, str) else record.state,
        "connected": bool(raw.get("connected")) and running,
        "server": raw.get("server") if running else None,
        "runtime": "running" if running and raw.get("runtime") == "running" else "stopped",
        "running": running,
        "pid": pid if running else None,
        "updated_at": raw.get("updated_at"),
        "jobs": raw.get("jobs") if isinstance(raw.get("jobs"), dict) else None,
        "edges": record.edges,
        "certificate": certificate_report(identity, str(node_id or "(not joined yet)")),
    }
