"""Temporal namespaces, one per tenant, registered through the frontend as this server.

temporalio is asyncio-only: the calls run on the loop of the caller's asyncio portal
(oz0_common/asyncio_portal.py; the temporal role owns one for them).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from google.protobuf.duration_pb2 import Duration
from temporalio.api.namespace.v1 import NamespaceConfig, NamespaceInfo
from temporalio.api.workflowservice.v1 import (
    DescribeNamespaceRequest,
    RegisterNamespaceRequest,
    UpdateNamespaceRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode, TLSConfig

from oz0.errors import Oz0Error
from oz0_common.asyncio_portal import Portal
from oz0_common.temporal_tls import tls_from_pems

T = TypeVar("T")


class InNamespace(Protocol):
    """The jobs role's Temporal calls (JobsRole.in_namespace): MAKE run with a client of
    NAMESPACE on the server's one connection, within WITHIN seconds. Raises the role's
    JobsUnavailable when it cannot make the call, TimeoutError past WITHIN, and what MAKE
    raises (temporalio's RPCError, whose NOT_FOUND callers tell apart) as it is."""

    async def __call__(
        self, namespace: str, make: Callable[[Client], Awaitable[T]], within: float
    ) -> T: ...


log = logging.getLogger(__name__)

# A namespace keeps its closed workflows as long as its tenant keeps its finished jobs
# (`tenant set --job-retention`, oz0/retention_rules.py): the job's row and its workflow's
# history go at about the same time.
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
        return tls_from_pems(self.ca_pem, self.cert_pem, self.key_pem)


async def ensure(
    portal: Portal, access: FrontendAccess, retentions: Mapping[str, int]
) -> list[str]:
    """Register every namespace of RETENTIONS (name: seconds) that Temporal lacks, and set
    the retention of those it has (ours) that differs (an earlier release's 7 days, a
    `tenant set` whose call to Temporal failed); returns those registered."""
    return await portal.call(_ensure, access, dict(retentions))


async def _ensure(access: FrontendAccess, retentions: dict[str, int]) -> list[str]:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    registered = []
    for name, retention in retentions.items():
        if await _register(client, name, retention):
            registered.append(name)
            continue
        answer = await client.workflow_service.describe_namespace(
            DescribeNamespaceRequest(namespace=name)
        )
        kept = answer.config.workflow_execution_retention_ttl.seconds
        if _ours(answer.namespace_info, name) and kept != retention:
            await _set_retention(client, name, retention)
    return registered


async def _register(client: Client, name: str, retention: int) -> bool:
    """Register NAME as a tenant's namespace; False if Temporal has it already."""
    try:
        await client.workflow_service.register_namespace(
            RegisterNamespaceRequest(
                namespace=name,
                workflow_execution_retention_period=Duration(seconds=retention),
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


async def set_retention(portal: Portal, access: FrontendAccess, name: str, retention: int) -> None:
    """Temporal keeps namespace NAME's closed workflows RETENTION seconds."""
    await portal.call(_set_retention_connected, access, name, retention)


async def _set_retention_connected(access: FrontendAccess, name: str, retention: int) -> None:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    await _set_retention(client, name, retention)


async def _set_retention(client: Client, name: str, retention: int) -> None:
    await client.workflow_service.update_namespace(
        UpdateNamespaceRequest(
            namespace=name,
            config=NamespaceConfig(workflow_execution_retention_ttl=Duration(seconds=retention)),
        )
    )
    log.info("namespace %s keeps closed workflows %d s", name, retention)


async def register_for_tenant(
    portal: Portal, access: FrontendAccess, name: str, retention: int
) -> None:
    """Make sure NAME is a namespace orchestrator-zero made for tenant NAME, keeping closed
    workflows RETENTION seconds: register it, or find it registered by us before (a retried
    `tenant create`). NamespaceTaken if Temporal has a namespace of that name that is not
    ours."""
    await portal.call(_register_for_tenant, access, name, retention)


def _ours(info: NamespaceInfo, name: str) -> bool:
    # Earlier releases marked their namespaces by the description alone.
    return info.data.get(OWNER_KEY) == name or (
        OWNER_KEY not in info.data and info.description == _description(name)
    )


async def _register_for_tenant(access: FrontendAccess, name: str, retention: int) -> None:
    client = await Client.connect(access.address, namespace="default", tls=access.tls())
    if await _register(client, name, retention):
        return
    answer = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=name)
    )
    info = answer.namespace_info
    if not _ours(info, name):
        raise NamespaceTaken(
            f"Temporal already has a namespace {name} that orchestrator-zero did not create; "
            "choose another tenant name"
        )
