"""The edge's side of a job's output: `job_output` from a node, stored, answered.

A node sends the output of its running attempts over its control stream (the protocol is
in docs/node-protocol.md) and waits for each chunk's `job_output_ack` before the next, so
when its attempt ends everything it sent is stored. A chunk is stored only if the attempt
runs on that very node: a node the job has moved away from (or a node naming another's
job) is told `ended`, and its output is not kept.
"""

from __future__ import annotations

import logging
from typing import Any

from oz0.server.edge.common import Edge, send
from oz0.server.edge.output_writes import BadOutput, OutputChunk, OutputWrite
from oz0.server.edge.wire import Wire
from oz0.store.outage import DATABASE_ERRORS

log = logging.getLogger(__name__)

OUTPUT = "job_output"
ACK = "job_output_ack"


async def receive(edge: Edge, ws: Wire, node_id: str, message: dict[str, Any]) -> None:
    """Store one chunk NODE_ID sent and answer it."""
    try:
        chunk = OutputChunk.parse(message)
    except BadOutput as e:
        log.warning("node %s sent a job_output that is not one (%s); ignored", node_id, e)
        return
    try:
        stored = bool(await edge.output_writes.run(OutputWrite(node_id, chunk)))
        reason = None if stored else "ended"
    except DATABASE_ERRORS as e:
        edge.outage.failed(e)
        stored, reason = False, "unavailable"
    await send(
        ws, ACK, job=chunk.job_id, attempt=chunk.attempt, seq=chunk.seq, stored=stored,
        reason=reason,
    )  # fmt: skip
