"""The soak's probe of a block from the node's side, on Temporal (issue 44): while the
workload blocks a node, the node's own identity (its certificate and key in its data
directory, as its runtime connects: oz0_node/runtime.py) asks each server's Temporal
frontend (FRONTEND_PORT, mutual TLS) for its namespace every PROBE_EVERY seconds, the
cheapest call a node may make (oz0/temporal/host/nodeapi.go) and the first a blocked one
is refused, until each refuses it (PERMISSION_DENIED) or the watch ends.

The status.json's word (its runtime stopped) says only when the node's own worker heard of
it; this says when every server's Temporal stopped taking the node's calls, which a node
whose runtime kept going could still make. Cheap at 100 nodes: one probe per block in
progress (a thread, its asyncio loop and one connection per server), its calls stopped at
each server's first refusal.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest
from temporalio.service import ConnectConfig, RPCError, RPCStatusCode, ServiceClient, TLSConfig

from oz0.temporal.host import FRONTEND_PORT
from oz0_common.temporal_tls import tls_from_files
from oz0_node.identity import IdentityDir

PROBE_EVERY = 0.05
CALL_DEADLINE = 1.0
REFUSED = (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNAUTHENTICATED)


@dataclass
class TemporalProbe:
    """One block's probe: DATA_DIR's identity, in NAMESPACE, against each of ADDRESSES."""

    data_dir: Path
    namespace: str
    addresses: tuple[str, ...]
    # Wall clock of each server's first refusal (absent: none yet, or never).
    refused: dict[str, float] = field(default_factory=dict)
    # Servers the probe could not reach at some point before their refusal (a fault): no
    # connection, or UNAVAILABLE; a call past its deadline is a slow server, not this.
    unreachable: set[str] = field(default_factory=set)
    stop: threading.Event = field(default_factory=threading.Event)
    # Why the probe could not run (the soak's trouble, not the cluster's), if so.
    failed: str | None = None

    def run(self, until: float) -> None:
        """Ask until every server refused, STOP is set, or the wall clock passes UNTIL (in
        the calling thread: the soak runs it in one of its own). Never raises: whatever
        stops it is its `failed`, so a probe's trouble never ends the soak."""
        try:
            asyncio.run(self._all(until))
        except Exception as e:
            self.failed = f"{type(e).__name__}: {e}"

    async def _all(self, until: float) -> None:
        identity = IdentityDir(self.data_dir)
        try:
            tls = tls_from_files(identity.ca_path, identity.cert_path, identity.key_path)
        except OSError as e:
            self.failed = f"cannot read the node's identity: {e}"
            return
        await asyncio.gather(*(self._one(address, tls, until) for address in self.addresses))

    async def _one(self, address: str, tls: TLSConfig, until: float) -> None:
        config = ConnectConfig(
            f"{address}:{FRONTEND_PORT}", tls=tls, lazy=True,
            connect_timeout=dt.timedelta(seconds=CALL_DEADLINE),
        )  # fmt: skip
        try:
            client = await ServiceClient.connect(config)
        except Exception as e:  # the bridge's errors have no one type
            self.failed = f"cannot connect to {address}: {e}"
            return
        request = DescribeNamespaceRequest(namespace=self.namespace)
        deadline = dt.timedelta(seconds=CALL_DEADLINE)
        while not self.stop.is_set() and time.time() < until:
            try:
                await client.workflow_service.describe_namespace(request, timeout=deadline)
            except RPCError as e:
                if e.status in REFUSED:
                    self.refused[address] = time.time()
                    return
                if e.status == RPCStatusCode.UNAVAILABLE:
                    self.unreachable.add(address)  # down: a fault's
            except RuntimeError:
                # A lazy client's connection made at its first call: a server that is down
                # (its host killed, or the server) is refused as "Failed client connect".
                self.unreachable.add(address)
            await asyncio.sleep(PROBE_EVERY)
