"""`oz0-node install-service`: the systemd unit that runs the agent (docs/manage-nodes.md,
"Run the agent under systemd").

A purge ends the agent with status 0 after deleting its data directory and its binary, and
the unit must then stay down for good. Two things see to that, and neither needs the agent
to touch systemd (it deletes nothing outside what it unpacked, and needs no bus access):
`Restart=on-failure` never restarts after status 0, and `ConditionPathExists=` on the
binary makes every later start (a failed run's restart, the next boot) skip the unit
instead of failing to execute a deleted file over and over. `KillMode=process` (as Nomad's
unit has it): `systemctl stop` and `restart` signal the agent alone, which stops its
plugins itself; its job attempts' supervisors run on, so an agent's restart or upgrade
never ends a command (the next agent re-attaches them, jobs/manager.py); only the agent is
killed if `TimeoutStopSec` runs out. `Delegate=yes` hands the agent its service's cgroup
(v2), where each attempt gets a cgroup of its own (jobs/isolation.py).

Run as root, it also makes the system user jobs run as (`oz0-job`) unless it exists.
"""

from __future__ import annotations

from pathlib import Path

from oz0_common.unit_files import install as install
from oz0_node.errors import AgentError

UNIT_NAME = "oz0-node.service"
SYSTEM_UNIT = Path("/etc/systemd/system") / UNIT_NAME
USER_UNIT = Path(".config", "systemd", "user") / UNIT_NAME  # under the user's home
# More than the agent needs to stop its runtime (runtime.STOP_TIMEOUT, under 10 s) and
# its plugins (plugins.STOP_GRACE and the reaping after it).
STOP_TIMEOUT = 30
RESTART_SEC = 5


def default_unit_path(euid: int, home: Path) -> Path:
    return SYSTEM_UNIT if euid == 0 else home / USER_UNIT


def unit_text(binary: Path, data_dir: Path, *, system: bool) -> str:
    for path in (binary, data_dir):
        if any(c.isspace() or c in "\"'\\%$" for c in str(path)):
            raise AgentError(f"{path}: a path for a systemd unit must have no spaces or quotes")
    target = "multi-user.target" if system else "default.target"
    return f"""\
[Unit]
Description=orchestrator-zero node agent (oz0-node)
Wants=network-online.target
After=network-online.target
# A purge deletes the binary: from then on the unit is skipped, never retried.
ConditionPathExists={binary}

[Service]
Type=exec
ExecStart={binary} start --data-dir {data_dir}
# Status 0 is a purge (or a clean stop): no restart.
Restart=on-failure
RestartSec={RESTART_SEC}
# The agent alone: its job attempts' supervisors outlive its restart (they are re-attached).
KillMode=process
TimeoutStopSec={STOP_TIMEOUT}
# Each job attempt gets a cgroup under the agent's, to end all of its processes and apply
# its limits.
Delegate=yes

[Install]
WantedBy={target}
"""
