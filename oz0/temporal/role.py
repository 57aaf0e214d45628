"""The temporal role as the server runs it: the host kept running, node table sync, namespaces."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg
import trio

from oz0 import tenants
from oz0.cluster import Cluster
from oz0.store.events import EventHub
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database
from oz0.temporal import namespaces
from oz0.temporal.host import FRONTEND_PORT
from oz0.temporal.host_keeper import (
    HostFailed,
    HostKeeper,
    HostSettings,
    HostTables,
    HostUnavailable,
)
from oz0.temporal.node_access import NodeAccessSync
from oz0.temporal.operator_access import OperatorAccessSync
from oz0_common.addresses import host_port
from oz0_common.asyncio_portal import Portal, asyncio_portal

log = logging.getLogger(__name__)


class Certificates(Protocol):
    """What this role needs of its server's certificates (oz0.server.certificates holds
    them; the server layer sits above this one, so the role names only what it uses)."""

    cluster: Cluster
    cert_pem: bytes
    key_pem: bytes

    def told_of_renewals(
        self, hook: Callable[[], Awaitable[None]]
    ) -> AbstractContextManager[None]: ...

    def temporal_tls(self) -> dict[str, str]: ...


@dataclass(frozen=True)
class Temporal:
    """What other roles use: the keeper of the host (commands to it) and the frontend."""

    keeper: HostKeeper
    certs: Certificates
    advertise: str
    # Where the namespace calls run (temporalio is asyncio-only).
    portal: Portal

    @property
    def frontend(self) -> namespaces.FrontendAccess:
        """This server's own frontend, reached with its current (renewed) certificate."""
        return namespaces.FrontendAccess(
            address=host_port(self.advertise, FRONTEND_PORT),
            ca_pem=self.certs.cluster.ca_pem,
            cert_pem=self.certs.cert_pem,
            key_pem=self.certs.key_pem,
        )

    async def ensure_namespaces(self, retentions: dict[str, int]) -> list[str]:
        return await namespaces.ensure(self.portal, self.frontend, retentions)

    async def register_tenant_namespace(self, name: str, retention: int) -> None:
        """The namespace of a new tenant; TenantExists if Temporal has one not ours."""
        try:
            await namespaces.register_for_tenant(self.portal, self.frontend, name, retention)
        except namespaces.NamespaceTaken as e:
            raise tenants.TenantExists(str(e)) from None

    async def set_namespace_retention(self, name: str, retention: int) -> None:
        await namespaces.set_retention(self.portal, self.frontend, name, retention)


@dataclass
class StateRecorder:
    """Writes the host's state to this server's row for `cluster info`: at once when the
    database answers, else as soon as it does again (only the latest state matters)."""

    db: Database
    server_id: str
    unwritten: str | None = None
    outage: Outage = field(default_factory=lambda: Outage("recording Temporal's state", log))
    _retry: trio.Event = field(default_factory=trio.Event)

    async def record(self, state: str) -> None:
        try:
            await self._write(state)
        except DATABASE_ERRORS as e:
            self.outage.failed(e)
            self.unwritten = state
            self._retry.set()
        else:
            self.unwritten = None

    async def retry_forever(self) -> None:
        while True:
            await self._retry.wait()
            self._retry = trio.Event()
            while (state := self.unwritten) is not None:
                try:
                    await self._write(state)
                except DATABASE_ERRORS as e:
                    await trio.sleep(self.outage.failed(e))
                    continue
                if self.unwritten == state:
                    self.unwritten = None

    async def _write(self, state: str) -> None:
        await self.db.transaction(
            lambda conn: conn.execute(
                "UPDATE servers SET temporal_state = %s WHERE id = %s", (state, self.server_id)
            )
        )
        self.outage.worked()


def tenant_retentions(conn: psycopg.Connection[Any]) -> dict[str, int]:
    """Each tenant's job retention in seconds, which its namespace keeps too."""
    rows = conn.execute("SELECT name, job_retention_s FROM tenants ORDER BY name")
    return {str(name): int(seconds) for name, seconds in rows}


async def run(
    db: Database,
    hub: EventHub,
    settings: HostSettings,
    certs: Certificates,
    server_id: str,
    *,
    task_status: trio.TaskStatus[Temporal] = trio.TASK_STATUS_IGNORED,
) -> None:
    recorder = StateRecorder(db, server_id)
    keeper = HostKeeper(settings, tls=certs.temporal_tls, on_state=recorder.record)
    sync = NodeAccessSync(db, hub, keeper)
    operator_sync = OperatorAccessSync(db, hub, keeper)

    async def push_renewed_certificates() -> None:
        tls = certs.temporal_tls()
        try:
            await keeper.command(
                "tls",
                frontendCert=tls["frontendCert"],
                frontendKey=tls["frontendKey"],
                internodeCert=tls["internodeCert"],
                internodeKey=tls["internodeKey"],
            )
        except (HostUnavailable, HostFailed) as e:
            log.warning(
                "renewed certificates not pushed to Temporal (its next start reads them): %s", e
            )

    # The syncs hear the hub from before the host's first start (its tables) to the role's end.
    with (
        certs.told_of_renewals(push_renewed_certificates),
        sync.subscribed(),
        operator_sync.subscribed(),
    ):
        async with asyncio_portal("oz0-temporal-calls") as portal, trio.open_nursery() as nursery:
            nursery.start_soon(recorder.retry_forever)
            tables = HostTables(nodes=sync.full_table, operators=operator_sync.full_table)
            await nursery.start(keeper.run, tables)
            await nursery.start(sync.run)
            await nursery.start(operator_sync.run)
            temporal = Temporal(keeper, certs, settings.advertise, portal)
            retentions = await db.transaction(tenant_retentions)
            registered = await temporal.ensure_namespaces(retentions)
            if registered:
                log.info("registered namespaces %s", ", ".join(registered))
            task_status.started(temporal)
