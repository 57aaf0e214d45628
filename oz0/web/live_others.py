"""Which changed nodes a live list of a person of some tenants may hear of.

A list on /ui/events asks to be told when nodes it does not show joined or changed (the
"others" notice). A cluster-wide person is told of any node; a person of some tenants
only of its tenants' nodes: another tenant's nodes joining, changing or going are none of
its business, and their timing would tell what that tenant does.

A notification names a node, not its tenant. A node's tenant never changes, so once read
it is remembered (up to TENANTS_KNOWN nodes, then forgotten all at once and read again as
needed): a known node of another tenant wakes no scoped list. The nodes that may concern
a scoped list are kept in one window for all of them (the last KEPT), each list reading on
from where it last looked; a list that fell further behind than the window looks at what
it still holds (the page still reloads to the truth). A node found in no row and no audit
row (its rows pruned) is told to no scoped list.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Collection
from dataclasses import dataclass, field

import trio

from oz0 import nodes
from oz0.store.pool import Database

KEPT = 20_000
TENANTS_KNOWN = 100_000


@dataclass
class Changed:
    """The nodes that changed, numbered, for the scoped lists of one server."""

    recent: deque[tuple[int, str]] = field(default_factory=lambda: deque(maxlen=KEPT))
    # How many were noted since the server started: a list's place in the window.
    count: int = 0
    tenant_of: dict[str, str] = field(default_factory=dict)
    # One read of unknown nodes' tenants at a time: the lists woken together wait for it
    # and find its answers, rather than asking the same.
    reading: trio.Lock = field(default_factory=trio.Lock)

    def note(self, node_id: str) -> None:
        self.count += 1
        self.recent.append((self.count, node_id))

    def outside(self, node_id: str, scope: Collection[str]) -> bool:
        """Whether NODE_ID is known to be a node of a tenant not in SCOPE."""
        tenant = self.tenant_of.get(node_id)
        return tenant is not None and tenant not in scope

    def since(self, seen: int) -> tuple[set[str], int]:
        """The nodes noted after number SEEN (those the window still holds), and the number
        to read on from."""
        noted: set[str] = set()
        for number, node_id in reversed(self.recent):
            if number <= seen:
                break
            noted.add(node_id)
        return noted, self.count

    async def any_within(self, db: Database, node_ids: set[str], scope: Collection[str]) -> bool:
        """Whether a node of NODE_IDS is of a tenant of SCOPE (their tenants read from the
        database once, for those not known yet)."""
        if any(n not in self.tenant_of for n in node_ids):
            async with self.reading:
                unknown = [n for n in node_ids if n not in self.tenant_of]
                if unknown:
                    found = await db.transaction(lambda conn: nodes.tenants_of(conn, unknown))
                    if len(self.tenant_of) + len(found) > TENANTS_KNOWN:
                        self.tenant_of.clear()
                    self.tenant_of.update(found)
        return any(self.tenant_of.get(n) in scope for n in node_ids)
