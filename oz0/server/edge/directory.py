"""The edges told to nodes: those of the servers that are up, without flaps."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import psycopg
import trio

from oz0 import membership
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database
from oz0.temporal.host import FRONTEND_PORT
from oz0_common.addresses import EDGE_PORT as EDGE_PORT
from oz0_common.addresses import host_port

log = logging.getLogger(__name__)

DIRECTORY_EVERY = 2.0


def edge_address(advertise: str) -> str:
    return host_port(advertise, EDGE_PORT)


def frontend_address(advertise: str) -> str:
    """This server's Temporal frontend as nodes reach it: same host as its edge."""
    return host_port(advertise, FRONTEND_PORT)


def next_edges(current: list[str], up: set[str], lingering: set[str], own: str | None) -> list[str]:
    """The edges to tell nodes about, with hysteresis so one late heartbeat is no news.

    A server comes in when its heartbeat is fresh (UP), leaves only once it has been
    silent for twice that (not LINGERING any more) or has removed its row; this server
    always lists itself, since it is obviously up when it answers.
    """
    edges = up | (set(current) & lingering)
    if own is not None:
        edges.add(own)
    return sorted(edges)


@dataclass
class EdgeDirectory:
    """The edges of the servers that are up (edge.heartbeats tells streams of a change)."""

    db: Database
    own: str | None = None
    edges: list[str] = field(default_factory=list)
    # Until then nobody leaves the list: right after a database outage every server's
    # heartbeat is old, and those of the others are not written again yet.
    keep_until: float = -math.inf

    async def refresh(self) -> None:
        def read(conn: psycopg.Connection[Any]) -> tuple[set[str], set[str]]:
            up = membership.servers_up(conn)
            lingering = membership.servers_up(conn, 2 * membership.UP_WINDOW)
            return (
                {edge_address(s.advertise) for s in up},
                {edge_address(s.advertise) for s in lingering},
            )

        up, lingering = await self.db.transaction(read)
        if trio.current_time() < self.keep_until:
            lingering = lingering | set(self.edges)
        edges = next_edges(self.edges, up, lingering, self.own)
        if edges != self.edges:
            self.edges = edges

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self.refresh()
        task_status.started()
        outage = Outage("reading the servers that are up", log)
        while True:
            await trio.sleep(DIRECTORY_EVERY)
            if outage.ongoing:
                self.keep_until = trio.current_time() + 2 * membership.UP_WINDOW.total_seconds()
            try:
                await self.refresh()
            except DATABASE_ERRORS as e:
                outage.failed(e)
                continue
            outage.worked()
