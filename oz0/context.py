"""A CLI context: where a cluster's servers are and the operator credentials to reach them.

A context directory holds `context.json`, `ca.crt`, `operator.crt` and `operator.key`,
every file mode 0600 and the directory 0700.

`servers` are the addresses the context was made with (or an operator wrote); `learned`
are the servers that were up when the CLI last asked the cluster (`learned_at`). The CLI
tries the written ones first, so a context pointed at one server (by hand, by a test) talks
to that one while it answers, then the learned ones.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import ipaddress
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from oz0.errors import Oz0Error
from oz0_common.addresses import MANAGEMENT_PORT as MANAGEMENT_PORT
from oz0_common.addresses import host_port
from oz0_common.files import write_private

CONTEXT_FILE = "context.json"
CA_FILE = "ca.crt"
CERT_FILE = "operator.crt"
KEY_FILE = "operator.key"
ENV_VAR = "OZ0_CONTEXT"


class ContextError(Oz0Error):
    pass


def config_home() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "orchestrator-zero"


def server_address(advertise: str) -> str:
    """HOST:PORT of a management API, from an address with or without a port."""
    if advertise.startswith("["):
        return advertise if "]:" in advertise else f"{advertise}:{MANAGEMENT_PORT}"
    if advertise.count(":") == 1:
        return advertise
    return host_port(advertise, MANAGEMENT_PORT)  # a host, or an IPv6 address unbracketed


_HOST_NAME = re.compile(
    r"(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]*[A-Za-z0-9])?)*\.?"
)


def check_address(address: str) -> str:
    """HOST:PORT of a management API from an IP address or host name, with or without a
    port; anything else is refused with one clear line."""
    full = server_address(address)
    host, _, port = full.rpartition(":")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    good_host = _HOST_NAME.fullmatch(bare) is not None
    try:
        ipaddress.ip_address(bare)
        good_host = True
    except ValueError:
        pass
    if not good_host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ContextError(
            f"--advertise must be HOST or HOST:PORT of a server (an IP address or a name), "
            f"not {address!r}"
        )
    return full


@dataclass(frozen=True)
class Context:
    directory: Path
    cluster: str
    operator: str
    servers: tuple[str, ...]
    ca_hash: str
    learned: tuple[str, ...] = ()
    learned_at: dt.datetime | None = None

    @property
    def addresses(self) -> tuple[str, ...]:
        """The servers to try, in order: those written, then those last seen up."""
        return self.servers + tuple(s for s in self.learned if s not in self.servers)

    def with_learned(self, servers: tuple[str, ...], now: dt.datetime) -> Context:
        return dataclasses.replace(self, learned=servers, learned_at=now)

    @property
    def path(self) -> Path:
        return self.directory / CONTEXT_FILE

    @property
    def ca_path(self) -> Path:
        return self.directory / CA_FILE

    @property
    def cert_path(self) -> Path:
        return self.directory / CERT_FILE

    @property
    def key_path(self) -> Path:
        return self.directory / KEY_FILE

    @classmethod
    def load(cls, path: Path) -> Context:
        if path.is_dir():
            path = path / CONTEXT_FILE
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            learned_at = raw.get("learned_at")
            return cls(
                directory=path.parent,
                cluster=str(raw["cluster"]),
                operator=str(raw["operator"]),
                servers=tuple(str(s) for s in raw["servers"]),
                ca_hash=str(raw["ca_hash"]),
                learned=tuple(str(s) for s in raw.get("learned", ())),
                learned_at=dt.datetime.fromisoformat(learned_at) if learned_at else None,
            )
        except FileNotFoundError:
            raise ContextError(f"context {path} not found") from None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ContextError(f"context {path} is unreadable or malformed: {e}") from None

    def to_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "cluster": self.cluster,
            "operator": self.operator,
            "servers": list(self.servers),
            "ca_hash": self.ca_hash,
        }
        if self.learned_at is not None:
            data["learned"] = list(self.learned)
            data["learned_at"] = self.learned_at.isoformat()
        return data

    def save(self) -> None:
        write_private(self.path, (json.dumps(self.to_json(), indent=2) + "\n").encode())

    def write_credentials(self, *, ca_pem: bytes, cert_pem: bytes, key_pem: bytes) -> None:
        """Write the whole context: key first, so a certificate never stands without it."""
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.directory.chmod(0o700)
        write_private(self.key_path, key_pem)
        write_private(self.cert_path, cert_pem)
        write_private(self.ca_path, ca_pem)
        self.save()


def select(explicit: Path | None = None) -> Context:
    """--context, else OZ0_CONTEXT, else the only context in the config directory. The flag
    comes first: it is typed for this one command, while the variable is exported for a
    whole shell (as the docs show), and a command must not reach another cluster than the
    one its own line names."""
    if explicit is not None:
        return Context.load(explicit.expanduser())
    from_env = os.environ.get(ENV_VAR)
    if from_env:
        return Context.load(Path(from_env).expanduser())
    home = config_home()
    found = sorted(home.glob(f"*/{CONTEXT_FILE}")) if home.is_dir() else []
    if len(found) == 1:
        return Context.load(found[0])
    if not found:
        raise ContextError(
            f"no CLI context found in {home}; set {ENV_VAR} or pass --context "
            "(server init and server operator issue create one)"
        )
    listed = ", ".join(str(p) for p in found)
    raise ContextError(f"several contexts found, choose one with {ENV_VAR} or --context: {listed}")
