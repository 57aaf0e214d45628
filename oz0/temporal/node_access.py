"""Keep the host's node table equal to the `nodes` table.

Three paths, each covering the others' gaps: a NOTIFY names the node that changed (fast,
but may be lost while the LISTEN connection reconnects); every second the rows with a
newer revision are re-read (catches lost notifications); every minute the whole table is
sent again (catches rows whose revision committed out of order), and at once after the
LISTEN connection was lost.

Each entry names the key of the node's current certificate, so Temporal takes a node's
calls only with that certificate: a renewal (a new key in the row, which bumps its revision
and notifies, migration 0006) makes the host refuse the old one and cut its calls. A node
that was never issued a certificate (pending) has no key in its entry.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NoReturn

import psycopg
import trio

from oz0.store.events import NODES, EventHub
from oz0.store.listen import Notification
from oz0.store.outage import DATABASE_ERRORS, Outage, until_it_works
from oz0.store.pool import Database
from oz0.temporal.host_keeper import HostFailed, HostKeeper, HostUnavailable, wake_as_served

log = logging.getLogger(__name__)

RECONCILE_EVERY = 1.0
REPLACE_EVERY = 60.0

NodeTable = dict[str, dict[str, str] | None]


# The key only once a certificate was issued for it: a pending node's key came with its
# join, but no certificate of the cluster names it yet.
_COLUMNS = (
    "id, tenant, state, revision,"
    " CASE WHEN certificate IS NOT NULL THEN public_key_sha256 END AS key_sha256"
)


def _entry(tenant: str, state: str, key_sha256: str | None) -> dict[str, str]:
    entry = {"tenant": tenant, "state": state}
    if key_sha256:
        entry["keySha256"] = key_sha256
    return entry


def read_all(conn: psycopg.Connection[Any]) -> tuple[dict[str, dict[str, str]], int]:
    rows = conn.execute(f"SELECT {_COLUMNS} FROM nodes").fetchall()
    table = {r[0]: _entry(r[1], r[2], r[4]) for r in rows}
    return table, max([0, *(int(r[3]) for r in rows)])


def read_changed(conn: psycopg.Connection[Any], since: int, ids: set[str]) -> tuple[NodeTable, int]:
    rows = conn.execute(
        f"SELECT {_COLUMNS} FROM nodes WHERE revision > %s OR id = ANY(%s)",
        (since, list(ids)),
    ).fetchall()
    table: NodeTable = {node_id: None for node_id in ids}
    table.update({r[0]: _entry(r[1], r[2], r[4]) for r in rows})
    return table, max([since, *(int(r[3]) for r in rows)])


@dataclass
class NodeAccessSync:
    db: Database
    hub: EventHub
    keeper: HostKeeper
    revision: int = 0
    _pending_ids: set[str] = field(default_factory=set)
    _wake: trio.Event = field(default_factory=trio.Event)
    _replace_now: bool = False
    outage: Outage = field(
        default_factory=lambda: Outage("syncing Temporal's node table from the database", log)
    )

    @contextmanager
    def subscribed(self) -> Iterator[None]:
        """The hub's news of nodes heard while the block runs (the role's, from before the
        host starts: a change the host's first table missed is pushed)."""
        with self.hub.subscription(NODES, notified=self._notified, on_gap=self._gap):
            yield

    def _gap(self) -> None:
        self._replace_now = True
        self._wake.set()

    async def full_table(self) -> dict[str, dict[str, str]]:
        """The whole table, as a (re)starting host gets it: waits for the database if it
        is away (a host restarted during an outage serves once it can be told who may)."""
        table, self.revision = await until_it_works(
            Outage("reading the node table for the Temporal host", log),
            partial(self.db.transaction, read_all),
        )
        return table

    def _notified(self, notification: Notification) -> None:
        self._pending_ids.add(notification.payload)
        self._wake.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            # A lambda: the loop replaces `_wake` after each wake.
            nursery.start_soon(wake_as_served, self.keeper, lambda: self._wake.set())
            await self._sync(task_status)

    async def _sync(self, task_status: trio.TaskStatus[None]) -> NoReturn:
        task_status.started()
        last_replace = trio.current_time()
        wait = RECONCILE_EVERY
        while True:
            with trio.move_on_after(wait):
                await self._wake.wait()
            self._wake = trio.Event()
            wait = RECONCILE_EVERY
            try:
                if self._replace_now or trio.current_time() - last_replace >= REPLACE_EVERY:
                    if await self._push_all():
                        last_replace = trio.current_time()
                        self._replace_now = False
                else:
                    await self._push_changes()
            except DATABASE_ERRORS as e:
                # What was missed while it failed is in the revisions, or the replace
                # after the LISTEN gap that comes with an outage.
                wait = max(wait, self.outage.failed(e))
                continue
            self.outage.worked()

    async def _push_changes(self) -> None:
        ids, self._pending_ids = self._pending_ids, set()
        try:
            changed, revision = await self.db.transaction(
                lambda conn: read_changed(conn, self.revision, ids)
            )
        except DATABASE_ERRORS:
            self._pending_ids |= ids
            raise
        if not changed:
            return
        if await self._push(changed, replace=False):
            self.revision = revision
        else:
            self._pending_ids |= ids

    async def _push_all(self) -> bool:
        table, revision = await self.db.transaction(read_all)
        if await self._push(dict(table), replace=True):
            self.revision = revision
            return True
        return False

    async def _push(self, nodes: NodeTable, *, replace: bool) -> bool:
        try:
            await self.keeper.command("authz", nodes=nodes, replace=replace)
        except (HostUnavailable, HostFailed) as e:
            # The next host start reads the whole table anyway.
            log.debug("node table not pushed: %s", e)
            return False
        return True
