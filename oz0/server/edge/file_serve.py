"""The edge's side of a file push (oz0_common/file_push.py, docs/files.md): a node's
`file_get` answered with a piece of the blob, read from the database (or from what this
server kept of it, oz0/file_blob_cache.py).

A node is served only a blob that a running part of its own names in its command (the
command its grant signs): it reads what it was told to write, and nothing else. The
node checks the SHA-256 itself; the edge is not trusted with it.

A stream's reads are bounded (`FileReads`): at most READS_PER_STREAM at once, each of at
most SERVED_MOST bytes, so what one node's push makes its edge hold and send ahead of the
stream's other messages (heartbeats, attempts, a block's close) stays small; a file_get
past the cap is answered `unavailable` at once, and the node asks again.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any

from oz0 import file_blobs
from oz0.server.edge.common import DatabaseUnavailable, Edge, send
from oz0.server.edge.wire import Closed, Wire
from oz0_common.file_push import DATA, READS_PER_STREAM, SERVED, SERVED_MOST, is_sha256

log = logging.getLogger(__name__)

UNAVAILABLE = "unavailable"


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


class FileReads:
    """One stream's file_get reads under way, at most MOST at once."""

    def __init__(self, most: int = READS_PER_STREAM) -> None:
        self.most = most
        self.running = 0

    def take(self) -> bool:
        """Whether one more read may start now (then `done` when it ends)."""
        if self.running >= self.most:
            return False
        self.running += 1
        return True

    def done(self) -> None:
        self.running -= 1


def _echo(message: dict[str, Any]) -> dict[str, Any]:
    return {k: message.get(k) for k in ("job", "attempt", "sha256", "offset")}


async def busy(ws: Wire, message: dict[str, Any]) -> None:
    """A file_get past the stream's cap: asked again by the node, as when the database is
    away. Sent from the stream's receive loop, so a node that asks faster than it reads
    its answers is not read either (what waits for it is its own socket's)."""
    with contextlib.suppress(Closed):
        await send(ws, DATA, **_echo(message), error=UNAVAILABLE)


async def serve(edge: Edge, ws: Wire, node_id: str, message: dict[str, Any]) -> None:
    """Answer one `file_get` from NODE_ID."""
    job, attempt, sha256, offset, most = (
        message.get("job"), message.get("attempt"), message.get("sha256"),
        message.get("offset"), message.get("most", SERVED),
    )  # fmt: skip
    if not isinstance(job, str) or not _whole(attempt) or not is_sha256(sha256):
        log.warning("node %s sent a file_get that is not one; ignored", node_id)
        return
    assert isinstance(attempt, int) and isinstance(sha256, str)
    fields: dict[str, Any] = {"job": job, "attempt": attempt, "sha256": sha256, "offset": offset}
    if not _whole(offset) or not _whole(most) or most == 0:
        fields["error"] = "offset and most must be whole numbers (most at least 1)"
    else:
        assert isinstance(offset, int) and isinstance(most, int)
        take = min(most, SERVED_MOST)
        try:
            found = await edge.transaction(
                lambda conn: file_blobs.read_for_node(
                    conn, node_id, job, attempt, sha256, offset, take, edge.blob_cache
                )
            )
        except DatabaseUnavailable:
            found, fields["error"] = None, UNAVAILABLE
        if found is not None:
            data, size = found
            fields |= {"data": base64.b64encode(data).decode("ascii"), "size": size}
        elif "error" not in fields:
            fields["error"] = f"no running part of job {job} on this node pushes {sha256}"
    with contextlib.suppress(Closed):
        await send(ws, DATA, **fields)
