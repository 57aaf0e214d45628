"""Jobs' output as nodes send it, written in batches: the chunks that arrive together, of
many nodes' attempts, in one transaction (store.batches.Batches), acked once committed.

An `--all` job's parts all write their chunks under the job's own lock (store.append_output:
one job's chunks commit in the order of their IDs, so a follower's cursor never passes one
still to commit). One transaction a chunk made a hundred parts take turns, a commit each;
a batch takes the lock once for all of the job's chunks it holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from oz0.jobs import store
from oz0.store.batches import Batches
from oz0.store.pool import Conn, Database


@dataclass(frozen=True)
class OutputWrite:
    """One chunk NODE_ID sent, stored (store.append_output): True, or False if that
    attempt no longer runs there."""

    node_id: str
    job_id: str
    attempt: int
    seq: int
    stream: str
    data: bytes
    truncated: bool

    def __call__(self, conn: Conn) -> bool:
        return store.append_output(
            conn, self.node_id, self.job_id, self.attempt, self.seq, self.stream, self.data,
            self.truncated,
        )  # fmt: skip


def write_together(conn: Conn, writes: list[Any]) -> list[tuple[Any, BaseException | None]]:
    """WRITES in one transaction, in the order of their jobs (two edges' batches take the
    jobs' locks in one order: no deadlock), each job's in the order they came."""
    order = sorted(range(len(writes)), key=lambda i: writes[i].job_id)
    stored = {i: writes[i](conn) for i in order}
    return [(stored[i], None) for i in range(len(writes))]


def output_writes(db: Database) -> Batches:
    """The edge's batches of output chunks; its `serve` is started with the edge."""
    return Batches(db, (), together=write_together)
