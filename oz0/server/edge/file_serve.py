"""The edge's side of a file push (oz0_common/file_push.py, docs/files.md): a node's
`file_get` answered with a piece of the blob, read from the database.

A node is served only a blob that a running part of its own names in its command (the
command its grant signs): it reads what it was told to write, and nothing else. The
node checks the SHA-256 itself; the edge is not trusted with it.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from typing import Any

from oz0 import file_blobs
from oz0.server.edge.common import DatabaseUnavailable, Edge, send
from oz0.server.edge.wire import Closed, Wire
from oz0_common.file_push import DATA, SERVED, is_sha256

log = logging.getLogger(__name__)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**62


async def serve(edge: Edge, ws: Wire, node_id: str, message: dict[str, Any]) -> None:
    """Answer one `file_get` from NODE_ID."""
    job, attempt, sha256, offset = (
        message.get("job"), message.get("attempt"), message.get("sha256"), message.get("offset"),
    )  # fmt: skip
    if not isinstance(job, str) or not _whole(attempt) or not is_sha256(sha256):
        log.warning("node %s sent a file_get that is not one; ignored", node_id)
        return
    assert isinstance(attempt, int) and isinstance(sha256, str)
    fields: dict[str, Any] = {"job": job, "attempt": attempt, "sha256": sha256, "offset": offset}
    if not _whole(offset):
        fields["error"] = "offset must be a whole number"
    else:
        assert isinstance(offset, int)
        try:
            found = await edge.transaction(
                lambda conn: file_blobs.read_for_node(
                    conn, node_id, job, attempt, sha256, offset, SERVED
                )
            )
        except DatabaseUnavailable:
            found, fields["error"] = None, "unavailable"
        if found is not None:
            data, size = found
            fields |= {"data": base64.b64encode(data).decode("ascii"), "size": size}
        elif "error" not in fields:
            fields["error"] = f"no running part of job {job} on this node pushes {sha256}"
    with contextlib.suppress(Closed):
        await send(ws, DATA, **fields)
