"""The `OZ0_DB` URL and the three databases named after it."""

from __future__ import annotations

import os
from dataclasses import dataclass

import psycopg.conninfo

from oz0.errors import Oz0Error

ENV_VAR = "OZ0_DB"


@dataclass(frozen=True)
class DatabaseNames:
    main: str
    temporal: str
    visibility: str

    def all(self) -> tuple[str, str, str]:
        return (self.main, self.temporal, self.visibility)


@dataclass(frozen=True)
class DatabaseUrl:
    conninfo: str

    @classmethod
    def from_env(cls) -> DatabaseUrl:
        url = os.environ.get(ENV_VAR, "").strip()
        if not url:
            raise Oz0Error(f"{ENV_VAR} is not set; set it to the cluster's PostgreSQL URL")
        return cls.parse(url)

    @classmethod
    def parse(cls, url: str) -> DatabaseUrl:
        try:
            params = psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as e:
            raise Oz0Error(f"{ENV_VAR} is not a valid PostgreSQL URL: {e}") from None
        if not params.get("dbname"):
            raise Oz0Error(f"{ENV_VAR} names no database; end the URL with /oz0 (or another name)")
        return cls(url)

    @property
    def names(self) -> DatabaseNames:
        base = str(psycopg.conninfo.conninfo_to_dict(self.conninfo)["dbname"])
        return DatabaseNames(base, f"{base}_temporal", f"{base}_temporal_visibility")

    @property
    def user(self) -> str:
        params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        return str(params.get("user") or os.environ.get("PGUSER") or _login_name())

    def for_database(self, dbname: str) -> str:
        return psycopg.conninfo.make_conninfo(self.conninfo, dbname=dbname)

    def redacted(self) -> str:
        """The URL without its password, for messages."""
        params = psycopg.conninfo.conninfo_to_dict(self.conninfo)
        params.pop("password", None)
        return psycopg.conninfo.make_conninfo("", **params)


def _login_name() -> str:
    import getpass

    return getpass.getuser()
