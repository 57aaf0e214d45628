"""Temporal namespaces, one per tenant, registered through the frontend as this server.

temporalio is asyncio-only: the calls run on the loop of the caller's asyncio portal
(oz0_common/asyncio_portal.py; the temporal role owns one for them).
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterable
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, RegisterNamespaceRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from oz0.errors import Oz0Error
from oz0_common.asyncio_portal import Portal

log = logging.getLogger(__name__)

RETENTION = dt.timedelta(days=7)
# Every namespace we register carries this in its data, naming its tenant: a namespace
# without it was made by someone else (an operator with the `temporal` CLI, say).
OWNER_KEY = "orchestrator-zero.tenant"


class NamespaceTaken(Oz0Error):
    """Temporal has a namespace of that name that orchestrator-zero did not create."""


def _description(name: str) -> str:
    return f"orchestrator-zero tenant {name}"


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


async def ensure(portal: Portal, access: FrontendAccess, names: Iterable[str]) -> list[str]:
    """Register every namespace in NAMES that Temporal lacks; returns those registered."""
    return await portal.call(_ensure, access, list(names))


async def _ensure(access: FrontendAccess, names: list[str]) -> list[str]:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    registered = []
    for name in names:
        if await _register(client, name):
            registered.append(name)
    return registered


async def _register(client: Client, name: str) -> bool:
    """Register NAME as a tenant's namespace; False if Temporal has it already."""
    try:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace=name,
                workflow_execution_retention_period=Duration(
                    seconds=int(RETENTION.total_seconds())
                ),
                description=_description(name),
                data={OWNER_KEY: name},
            )
        )
    except RPCError as e:
        if e.status != RPCStatusCode.ALREADY_EXISTS:
            raise
        return False
    log.info("registered Temporal namespace %s", name)
    return True


async def register_for_tenant(portal: Portal, access: FrontendAccess, name: str) -> None:
    """Make sure NAME is a namespace orchestrator-zero made for tenant NAME: register it,
    or find it registered by us before (a retried `tenant create`). NamespaceTaken if
    Temporal has a namespace of that name that is not ours."""
    await portal.call(_register_for_tenant, access, name)


async def _register_for_tenant(access: FrontendAccess, name: str) -> None:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    if await _register(client, name):
        return
    answer = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=name)
    )
    info = answer.namespace_info
    # Earlier releases marked their namespaces by the description alone.
    if info.data.get(OWNER_KEY) != name and not (
        OWNER_KEY not in info.data and info.description == _description(name)
    ):
        raise NamespaceTaken(
            f"Temporal already has a namespace {name} that orchestrator-zero did not create; "
            "choose another tenant name"
        )
