"""A dedicated LISTEN connection woken by the event loop, not by polling."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import psycopg
import trio

from oz0.errors import Oz0Error


class ListenConnectionLost(Oz0Error):
    """The LISTEN connection broke; notifications may have been missed."""


@dataclass(frozen=True)
class Notification:
    channel: str
    payload: str


async def listen(
    conninfo: str,
    channels: Iterable[str],
    on_notify: Callable[[Notification], None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Call ON_NOTIFY for every notification on CHANNELS until cancelled.

    Reports started only once every LISTEN is registered. A dead connection raises
    ListenConnectionLost: whoever supervises this decides how to retry and must then
    reconcile, since notifications sent meanwhile are gone.
    """
    conn = await trio.to_thread.run_sync(
        lambda: psycopg.connect(conninfo, autocommit=True, application_name="oz0-listen")
    )
    try:
        for channel in channels:
            await trio.to_thread.run_sync(
                conn.execute, psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(channel))
            )
        task_status.started()
        pgconn = conn.pgconn
        while True:
            await trio.lowlevel.wait_readable(pgconn.socket)
            try:
                pgconn.consume_input()
            except psycopg.OperationalError as e:
                raise ListenConnectionLost(f"LISTEN connection lost: {e}") from None
            if pgconn.status != psycopg.pq.ConnStatus.OK:
                raise ListenConnectionLost("LISTEN connection lost")
            while (raw := pgconn.notifies()) is not None:
                on_notify(Notification(raw.relname.decode(), raw.extra.decode()))
    finally:
        conn.close()
