"""What the agent knows about itself while it runs, kept on disk as it changes.

node.json remembers (cluster, node ID, tenant, edges, state as last known, launcher,
max jobs);
status.json reports (that plus whether a control stream is up and to which server, and
whether the runtime runs). Every
change goes through here, so neither file ever lags behind the other.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterable

from oz0_node import addresses, status
from oz0_node.identity import DEFAULT_MAX_JOBS, IdentityDir, NodeRecord
from oz0_node.jobs.grants import RunRecord
from oz0_node.jobs.isolation import Isolation

log = logging.getLogger(__name__)


class Node:
    def __init__(self, identity: IdentityDir, record: NodeRecord) -> None:
        self.identity = identity
        self.record = record
        self.connected = False
        self.server: str | None = None
        self.runtime = "stopped"
        # How jobs run (the job user, the tracking), for status.json; set at the start.
        self.isolation: Isolation | None = None
        self.session_users: frozenset[str] = frozenset()
        # The attempts it ran: when unreadable, no attempt runs, and status.json says why.
        self.run_record: RunRecord | None = None

    @property
    def name(self) -> str:
        return self.record.node_id or "(not joined yet)"

    def edges(self) -> list[str]:
        return self.record.edges

    def remember(
        self,
        *,
        node_id: str | None = None,
        tenant: str | None = None,
        state: str | None = None,
        edges: Iterable[str] = (),
        launcher: str | None = None,
        max_jobs: int | None = None,
    ) -> None:
        """Record what the edge told; unchanged files are not rewritten."""
        before = dataclasses.replace(self.record, edges=list(self.record.edges))
        if node_id is not None:
            self.record.node_id = node_id
        if tenant is not None:
            self.record.tenant = tenant
        if state is not None and state != self.record.state:
            log.info("node %s is now %s", self.name, state)
            self.record.state = state
        if launcher is not None:
            self.record.launcher = launcher
        if max_jobs is not None:
            self.record.max_jobs = max_jobs
        merged = addresses.merge(self.record.edges, edges)
        if merged != self.record.edges:
            log.info("known edges: %s", ", ".join(merged))
            self.record.edges = merged
        if self.record != before:
            self.identity.save_record(self.record)
            self.publish()

    def stream_up(self, server: str) -> None:
        self.connected, self.server = True, server
        self.publish()

    def stream_down(self) -> None:
        if self.connected or self.server is not None:
            self.connected, self.server = False, None
            self.publish()

    def runtime_changed(self, state: str) -> None:
        """The runtime is now "running" or "stopped"."""
        if state != self.runtime:
            self.runtime = state
            self.publish()

    def _jobs(self) -> dict[str, object] | None:
        """How jobs run here: as whom, tracked how, how many at once; why none runs, if
        none can."""
        if self.isolation is None:
            return None
        jobs: dict[str, object] = {
            **self.isolation.describe(self.record.node_id),
            "max_jobs": self.record.max_jobs or DEFAULT_MAX_JOBS,
            # The accounts sessions may run as (--session-users), besides their own UIDs.
            "session_users": sorted(self.session_users),
        }
        if self.run_record is not None and self.run_record.unusable is not None:
            jobs["not_run"] = self.run_record.unusable
        return jobs

    def publish(self) -> None:
        status.write(
            self.identity.data_dir,
            status.Status(
                node_id=self.record.node_id,
                cluster=self.record.cluster,
                state=self.record.state,
                connected=self.connected,
                server=self.server,
                runtime=self.runtime,
                jobs=self._jobs(),
            ),
        )
