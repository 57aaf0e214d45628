"""Temporal namespaces, one per tenant, registered through the frontend as this server.

temporalio is asyncio-only: each call runs its own event loop in a worker thread.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import trio
from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

log = logging.getLogger(__name__)

RETENTION = dt.timedelta(days=7)


@dataclass(frozen=True)
class FrontendAccess:
    """How this server reaches its own frontend: address and its own credentials."""

    address: str
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def tls(self) -> TLSConfig:
        return TLSConfig(
            server_root_ca_cert=self.ca_pem,
            client_cert=self.cert_pem,
            client_private_key=self.key_pem,
        )


async def ensure(access: FrontendAccess, names: Iterable[str]) -> list[str]:
    """Register every namespace in NAMES that Temporal lacks; returns those registered."""
    wanted = list(names)
    return await trio.to_thread.run_sync(lambda: asyncio.run(_ensure(access, wanted)))


async def _ensure(access: FrontendAccess, names: list[str]) -> list[str]:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    registered = []
    for name in names:
        try:
            await client.workflow_service.register_namespace(
                RegisterNamespaceRequest(
                    namespace=name,
                    workflow_execution_retention_period=Duration(
                        seconds=int(RETENTION.total_seconds())
                    ),
                    description=f"orchestrator-zero tenant {name}",
                )
            )
            registered.append(name)
            log.info("registered Temporal namespace %s", name)
        except RPCError as e:
            if e.status != RPCStatusCode.ALREADY_EXISTS:
                raise
    return registered
