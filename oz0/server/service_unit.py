"""`orchestrator-zero server install-service`: the systemd unit that runs a server
(docs/run-a-cluster.md, "Run a server under systemd"), beside the agent's
(oz0_node/service.py).

`Type=notify`: the server tells systemd READY=1 once its management API and edge listen
(oz0/server/start.py), so `systemctl start` returns when it serves, and a unit ordered
after it starts then. The first start of a release may migrate the schema and the Temporal
host takes seconds to come up: TimeoutStartSec allows for both.

No secret is in the unit or on a command line (every user of the machine reads those):
- the master key stays in its root-owned 0600 file; systemd hands the service a private
  copy (`LoadCredential=`, read from `%d`, the service's credentials directory), so the
  service's user never needs to read the original;
- the database URL, whose password is a secret, is read from an environment file, 0600,
  that systemd reads as root before starting the service.

Least privilege: a system unit runs as a user systemd makes for it alone
(`DynamicUser=yes`; or `--user` for an account of your own, say for PostgreSQL's peer
authentication), with no capabilities, nothing of the file system writable, and only the
socket families the server uses. `KillMode=mixed`: a stop signals the server alone, which
drains while its Temporal host still runs and then stops it; what is left when the server
has exited is killed.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from pathlib import Path

from oz0.errors import Oz0Error
from oz0_common.files import write_private
from oz0_common.unit_files import install as install

UNIT_NAME = "oz0-server.service"
SYSTEM_UNIT = Path("/etc/systemd/system") / UNIT_NAME
USER_UNIT = Path(".config", "systemd", "user") / UNIT_NAME  # under the user's home
DEFAULT_ENV_FILE = Path("/etc/orchestrator-zero/server.env")
MASTER_KEY_CREDENTIAL = "master-key"
UI_KEY_CREDENTIAL = "ui-key"
# A first start of a release migrates the schema and sets Temporal's up.
START_TIMEOUT = 300
# More than the server's drain (start.SHUTDOWN_GRACE) and its roles' bounded cleanup.
STOP_TIMEOUT = 30
RESTART_SEC = 5
# The server raises its soft limit to the hard one: a socket for each node's stream.
OPEN_FILES = 1048576
# What a unit's path or argument may not hold: systemd would split or expand it.
_UNSAFE = frozenset(" \t\n\"'\\%$;")


@dataclass(frozen=True)
class ServerUnit:
    """What `server start` is given in the unit."""

    binary: Path
    advertise: str
    master_key_file: Path
    env_file: Path
    sans: tuple[str, ...] = ()
    listen: str | None = None
    ui_cert: Path | None = None
    ui_key: Path | None = None
    user: str | None = None  # None: DynamicUser=yes (system units)

    def check(self) -> None:
        for path in (self.binary, self.master_key_file, self.env_file, self.ui_cert, self.ui_key):
            if path is not None:
                _check_safe(str(path), "a path")
                if not path.is_absolute():
                    raise Oz0Error(f"{path}: a path for a systemd unit must be absolute")
        for word in (self.advertise, self.listen, *self.sans):
            if word is not None:
                _check_safe(word, "an argument")
        if self.user is not None and not _is_user_name(self.user):
            raise Oz0Error(f"--user {self.user!r} is not a user name")
        if self.listen is not None:
            try:
                ipaddress.ip_address(self.listen)
            except ValueError:
                raise Oz0Error(f"--listen must be an IP address, not {self.listen!r}") from None


def _check_safe(text: str, what: str) -> None:
    if not text or any(c in _UNSAFE for c in text):
        raise Oz0Error(f"{text!r}: {what} for a systemd unit must have no spaces, quotes or %$;")


def _is_user_name(name: str) -> bool:
    return bool(name) and name[0].isalpha() and all(c.isalnum() or c in "-_." for c in name)


def default_unit_path(euid: int, home: Path) -> Path:
    return SYSTEM_UNIT if euid == 0 else home / USER_UNIT


def exec_start(unit: ServerUnit, *, system: bool) -> str:
    if system:
        key = f"%d/{MASTER_KEY_CREDENTIAL}"
        ui_key = f"%d/{UI_KEY_CREDENTIAL}" if unit.ui_key is not None else None
    else:
        key, ui_key = str(unit.master_key_file), str(unit.ui_key) if unit.ui_key else None
    words = [str(unit.binary), "server", "start", "--master-key-file", key]
    words += ["--advertise", unit.advertise]
    for san in unit.sans:
        words += ["--san", san]
    if unit.listen is not None:
        words += ["--listen", unit.listen]
    if unit.ui_cert is not None and ui_key is not None:
        words += ["--ui-cert", str(unit.ui_cert), "--ui-key", ui_key]
    return " ".join(words)


def unit_text(unit: ServerUnit, *, system: bool) -> str:
    unit.check()
    credentials = f"LoadCredential={MASTER_KEY_CREDENTIAL}:{unit.master_key_file}\n"
    if unit.ui_key is not None:
        credentials += f"LoadCredential={UI_KEY_CREDENTIAL}:{unit.ui_key}\n"
    if system:
        account = f"User={unit.user}\n" if unit.user else "DynamicUser=yes\n"
        sandbox = f"""\
# Least privilege: its own user, no capabilities, nothing writable but its private /tmp.
{account}{credentials}NoNewPrivileges=yes
CapabilityBoundingSet=
AmbientCapabilities=
ProtectSystem=strict
ProtectHome=read-only
PrivateTmp=yes
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
UMask=0077
"""
        target = "multi-user.target"
    else:
        # A user manager has no credentials to hand out nor the privilege to sandbox: the
        # service runs as you and reads your own 0600 key file.
        sandbox = "NoNewPrivileges=yes\nUMask=0077\n"
        target = "default.target"
    return f"""\
[Unit]
Description=orchestrator-zero server
Wants=network-online.target
After=network-online.target postgresql.service

[Service]
# Ready once the management API and the edge listen: the server sends READY=1.
Type=notify
NotifyAccess=main
ExecStart={exec_start(unit, system=system)}
# OZ0_DB (the database URL, with its password): 0600, read by systemd, not on a command line.
EnvironmentFile={unit.env_file}
Restart=on-failure
RestartSec={RESTART_SEC}
TimeoutStartSec={START_TIMEOUT}
# The server alone gets SIGTERM and drains; its Temporal host stops after it.
KillMode=mixed
TimeoutStopSec={STOP_TIMEOUT}
LimitNOFILE={OPEN_FILES}
{sandbox}
[Install]
WantedBy={target}
"""


def env_file_text(database_url: str) -> str:
    """The environment file holding OZ0_DB, as systemd's EnvironmentFile= reads it (within
    double quotes, a backslash escapes \\ and \")."""
    if "\n" in database_url or "\r" in database_url:
        raise Oz0Error("OZ0_DB must be one line")
    quoted = database_url.replace("\\", "\\\\").replace('"', '\\"')
    return f'OZ0_DB="{quoted}"\n'


def install_env_file(path: Path, database_url: str | None) -> bool:
    """Make PATH (0600) from DATABASE_URL unless it exists; an existing one must be private.
    Whether it was written."""
    try:
        mode = path.stat().st_mode & 0o777
    except FileNotFoundError:
        mode = None
    except OSError as e:
        raise Oz0Error(f"cannot read {path}: {e.strerror or e}") from None
    if mode is not None:
        if mode & 0o077:
            raise Oz0Error(
                f"{path} is open to group or others (mode {mode:04o}); it holds the database"
                f" password: run chmod 600 {path}"
            )
        return False
    if not database_url:
        raise Oz0Error(
            f"{path} does not exist and OZ0_DB is not set: set OZ0_DB to the cluster's"
            " PostgreSQL URL (it is written there, 0600) or write the file yourself"
        )
    text = env_file_text(database_url)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_private(path, text.encode())
    except OSError as e:
        raise Oz0Error(f"cannot write {path}: {e.strerror or e}") from None
    return True
