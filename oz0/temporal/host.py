"""The Temporal host binary and the configuration it reads on stdin."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg.conninfo

from oz0.errors import Oz0Error
from oz0.store.dburl import DatabaseUrl

HOST_ENV = "OZ0_TEMPORAL_HOST"
_BUILT = Path(__file__).resolve().parent / "host" / "bin" / "oz0-temporal-host"
FRONTEND_PORT = 7233


def host_binary() -> Path:
    """The host to run: $OZ0_TEMPORAL_HOST, else the one built at install."""
    path = Path(os.environ.get(HOST_ENV) or _BUILT)
    if not os.access(path, os.X_OK):
        raise Oz0Error(
            f"the Temporal host is not built ({path} is missing); install Go >= 1.26.4 and run "
            f"`bash {_BUILT.parent.parent / 'build.sh'}` (or reinstall orchestrator-zero: from "
            f"the wheel `nox -s wheel` builds, which carries the host, no Go is needed)"
        )
    return path


@dataclass(frozen=True)
class TemporalStores:
    """Where Temporal keeps its data: two PostgreSQL databases, or SQLite visibility in dev."""

    url: DatabaseUrl
    visibility_sqlite: Path | None = None

    def to_json(self) -> dict[str, Any]:
        params = psycopg.conninfo.conninfo_to_dict(self.url.conninfo)
        names = self.url.names
        config: dict[str, Any] = {
            "host": str(params.get("host") or os.environ.get("PGHOST") or "127.0.0.1"),
            "port": int(str(params.get("port") or os.environ.get("PGPORT") or 5432)),
            "user": self.url.user,
            "password": str(params.get("password") or os.environ.get("PGPASSWORD") or ""),
            "database": names.temporal,
            "visibilityDatabase": names.visibility,
            "sslmode": str(params.get("sslmode") or "disable"),
            # Our init creates the databases; the host must not.
            "createDatabases": False,
        }
        if self.visibility_sqlite is not None:
            config["visibilitySqliteFile"] = str(self.visibility_sqlite)
        return config


def setup_schema(stores: TemporalStores) -> list[dict[str, Any]]:
    """Create or migrate Temporal's schema (idempotent); returns what changed per database."""
    line = json.dumps(
        {"postgres": stores.to_json(), "numHistoryShards": 1, "advertise": "127.0.0.1"}
    )
    try:
        done = subprocess.run(
            [str(host_binary()), "setup-schema"],
            input=line + "\n",
            capture_output=True,
            text=True,
            timeout=300,
        )
    except subprocess.TimeoutExpired:
        raise Oz0Error("setting up Temporal's schema took more than 5 minutes") from None
    result = _last_json(done.stdout)
    if done.returncode != 0 or not result.get("ok"):
        reason = result.get("error") or _last_line(done.stderr) or f"exit code {done.returncode}"
        raise Oz0Error(f"setting up Temporal's schema failed: {reason}")
    databases: list[dict[str, Any]] = result.get("databases") or []
    return databases


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.splitlines()):
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
