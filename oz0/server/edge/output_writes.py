"""Jobs' output as nodes send it (`job_output`: one chunk, OutputChunk, as both its parse
and its write read it), written in batches: the chunks that arrive together, of many
nodes' attempts, in one transaction (store.batches.Batches), acked once committed.

An `--all` job's parts all write their chunks under the job's own lock (store.append_output:
one job's chunks commit in the order of their IDs, so a follower's cursor never passes one
still to commit). One transaction a chunk would make a hundred parts take turns, a commit
each; a batch takes the lock once for all of the job's chunks it holds.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Any

from oz0.jobs import store
from oz0.jobs.spec import is_job_id
from oz0.store.batches import Batches
from oz0.store.pool import Conn, Database

STREAMS = ("stdout", "stderr")


class BadOutput(ValueError):
    pass


@dataclass(frozen=True)
class OutputChunk:
    job_id: str
    attempt: int
    seq: int
    stream: str
    data: bytes
    truncated: bool

    @classmethod
    def parse(cls, message: dict[str, Any]) -> OutputChunk:
        job_id, attempt, seq = message.get("job"), message.get("attempt"), message.get("seq")
        if not isinstance(job_id, str) or not is_job_id(job_id):
            raise BadOutput("no valid job ID")
        if not _whole(attempt, 1) or not _whole(seq, 0):
            raise BadOutput("no valid attempt and seq")
        stream, data, truncated = (
            message.get("stream"),
            message.get("data"),
            message.get("truncated", False),
        )
        if stream not in STREAMS:
            raise BadOutput("stream must be stdout or stderr")
        if not isinstance(truncated, bool) or not isinstance(data, str):
            raise BadOutput("no data")
        # Base64 of MAX_CHUNK bytes is 4/3 as long: anything longer is too much at once.
        if len(data) > (store.MAX_CHUNK * 4) // 3 + 4:
            raise BadOutput(f"more than {store.MAX_CHUNK} bytes in one chunk")
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise BadOutput("data is not base64") from None
        assert isinstance(attempt, int) and isinstance(seq, int) and isinstance(stream, str)
        return cls(job_id, attempt, seq, stream, raw, truncated)


def _whole(value: object, low: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value < 2**31


@dataclass(frozen=True)
class OutputWrite:
    """CHUNK as NODE_ID sent it, stored (store.append_output): True, or False if that
    attempt no longer runs there."""

    node_id: str
    chunk: OutputChunk

    @property
    def job_id(self) -> str:
        return self.chunk.job_id

    def __call__(self, conn: Conn) -> bool:
        c = self.chunk
        return store.append_output(
            conn, self.node_id, c.job_id, c.attempt, c.seq, c.stream, c.data, c.truncated
        )


def write_together(conn: Conn, writes: list[Any]) -> list[tuple[Any, BaseException | None]]:
    """WRITES in one transaction, in the order of their jobs (two edges' batches take the
    jobs' locks in one order: no deadlock), each job's in the order they came."""
    order = sorted(range(len(writes)), key=lambda i: writes[i].job_id)
    stored = {i: writes[i](conn) for i in order}
    return [(stored[i], None) for i in range(len(writes))]


def output_writes(db: Database) -> Batches:
    """The edge's batches of output chunks; its `serve` is started with the edge."""
    return Batches(db, (), together=write_together)
