"""Keep the host's table of operators' grants equal to `operators`: each one's current
certificate serial, role and tenants.

Only the certificate an operator holds now may call Temporal, and only to read in its
tenants' namespaces (oz0/temporal/host/operatorapi.go): after `operator renew` or a
re-issue the old one is refused, and after a removal or a change of role or tenants the
new grant holds, within two seconds. A NOTIFY on `oz0_operators` says an operator changed
(fast); every second the table is read again anyway (it is small), which covers lost
notifications and expiry. Only a table that differs from what the host has is pushed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import trio

from oz0 import operators
from oz0.store.events import OPERATORS, EventHub
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS, Outage, until_it_works
from oz0.store.pool import Database
from oz0.temporal.host_keeper import HostFailed, HostKeeper, HostUnavailable, wake_as_served

log = logging.getLogger(__name__)

RECONCILE_EVERY = 1.0

# operator name -> {"serial": decimal, "role": ..., "tenants": [...]} (operators.temporal_grants)
OperatorTable = dict[str, dict[str, Any]]


@dataclass
class OperatorAccessSync:
    db: Database
    hub: EventHub
    keeper: HostKeeper
    # What the host holds, as far as we know; None until the first push or host start.
    pushed: OperatorTable | None = None
    _wake: trio.Event = field(default_factory=trio.Event)
    outage: Outage = field(default_factory=lambda: Outage("reading operators' grants", log))

    @contextmanager
    def subscribed(self) -> Iterator[None]:
        """The hub's news of operators heard while the block runs (the role's, from before
        the host starts, as the node table's)."""
        with self.hub.subscription(OPERATORS, notified=self._notified, on_gap=self._notified_gap):
            yield

    def _notified(self, _notification: Notification) -> None:
        self._wake.set()

    def _notified_gap(self) -> None:
        self._wake.set()

    async def full_table(self) -> OperatorTable:
        """The whole table, as a (re)starting host gets it: waits for the database if it is
        away, as the node table does."""
        table = await until_it_works(
            Outage("reading operators' grants for the Temporal host", log),
            partial(self.db.transaction, operators.temporal_grants),
        )
        self.pushed = table
        return table

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # A lambda: the loop replaces `_wake` after each wake.
            nursery.start_soon(wake_as_served, self.keeper, lambda: self._wake.set())
            await self._sync(task_status)

    async def _sync(self, task_status: trio.TaskStatus[None]) -> NoReturn:
        task_status.started()
        while True:
            with trio.move_on_after(RECONCILE_EVERY):
                await self._wake.wait()
            self._wake = trio.Event()
            await self.sync_once()

    async def sync_once(self) -> bool:
        """Read the table and push it if the host lacks it; whether the host has it now."""
        try:
            table = await self.db.transaction(operators.temporal_grants)
        except DATABASE_ERRORS as e:
            # Logged once per outage; the loop tries again every second.
            self.outage.failed(e)
            return False
        self.outage.worked()
        if table == self.pushed:
            return True
        try:
            await self.keeper.command("operators", operators=table)
        except (HostUnavailable, HostFailed) as e:
            # The next host start reads the whole table anyway.
            log.debug("operators' grants not pushed: %s", e)
            return False
        self.pushed = table
        return True
