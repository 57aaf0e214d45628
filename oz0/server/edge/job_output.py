"""The edge's side of a job's output: `job_output` from a node, stored, answered.

A node sends the output of its running attempts over its control stream (the protocol is
in docs/node-protocol.md) and waits for each chunk's `job_output_ack` before the next, so
when its attempt ends everything it sent is stored. A chunk is stored only if the attempt
runs on that very node: a node the job has moved away from (or a node naming another's
job) is told `ended`, and its output is not kept.
"""

from __future__ import annotations

import base64
import binascii
import logging
from dataclasses import dataclass
from typing import Any

from oz0.jobs import store
from oz0.jobs.spec import is_job_id
from oz0.server.edge.common import Edge, send
from oz0.server.edge.output_writes import OutputWrite
from oz0.server.edge.wire import Wire
from oz0.store.outage import DATABASE_ERRORS

log = logging.getLogger(__name__)

OUTPUT = "job_output"
ACK = "job_output_ack"
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


async def receive(edge: Edge, ws: Wire, node_id: str, message: dict[str, Any]) -> None:
    """Store one chunk NODE_ID sent and answer it."""
    try:
        chunk = OutputChunk.parse(message)
    except BadOutput as e:
        log.warning("node %s sent a job_output that is not one (%s); ignored", node_id, e)
        return
    try:
        write = OutputWrite(
            node_id, chunk.job_id, chunk.attempt, chunk.seq, chunk.stream, chunk.data,
            chunk.truncated,
        )  # fmt: skip
        stored = bool(await edge.output_writes.run(write))
        reason = None if stored else "ended"
    except DATABASE_ERRORS as e:
        edge.outage.failed(e)
        stored, reason = False, "unavailable"
    await send(
        ws, ACK, job=chunk.job_id, attempt=chunk.attempt, seq=chunk.seq, stored=stored,
        reason=reason,
    )  # fmt: skip
