"""Sessions a stopped server left open, ended in the records (docs/sessions.md, "When a
session ends").

A server killed (SIGKILL, a crash, its machine gone) cannot write its sessions' ends: their
rows would say "live" for ever. Its nodes ended those sessions when their streams to it
ended, and its recordings are in PostgreSQL as far as anyone saw them, so all that is left
is the row and its `session.end` audit row. Every server looks every SWEEP_EVERY, and once
as it starts (so a cluster of one server does it when that server comes back), for
sessions whose server is no longer up (membership: no heartbeat for UP_WINDOW) and ends
them (node_sessions.end_orphans, idempotent when several servers look at once). A session
is so ended within UP_WINDOW + SWEEP_EVERY (and a transaction) of its server's last beat.
"""

from __future__ import annotations

import logging

import trio

from oz0 import audit, node_sessions
from oz0.store.outage import DATABASE_ERRORS, Outage
from oz0.store.pool import Database

log = logging.getLogger(__name__)

SWEEP_EVERY = 2.0


async def run(
    db: Database,
    server_id: str,
    *,
    every: float = SWEEP_EVERY,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Sweep now, then every EVERY, for as long as the server runs."""
    actor = audit.Actor("server", server_id)
    outage = Outage("ending the sessions of stopped servers", log)
    started = False
    while True:
        try:
            ended = await db.transaction(lambda conn: node_sessions.end_orphans(conn, actor))
        except DATABASE_ERRORS as e:
            wait = outage.failed(e)
        else:
            outage.worked()
            wait = every
            if ended:
                log.info(
                    "ended %d session(s) whose server stopped: %s", len(ended), ", ".join(ended)
                )
        if not started:
            started = True
            task_status.started()
        await trio.sleep(wait)
