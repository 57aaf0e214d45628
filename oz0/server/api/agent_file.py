"""GET /agent/oz0-node and /agent/oz0-node.sha256: the agent file, with no sign-in (it
holds no secret; the join command checks it against the SHA-256 it was given)."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import trio
from quart import Response
from quart_trio import QuartTrio

from oz0.agent_file import FILE_NAME, agent_file, missing_advice
from oz0.server.api.common import ApiError, ManagementState

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


class _Digests:
    """The file's SHA-256, computed again only when the file changes."""

    def __init__(self) -> None:
        self._key: tuple[int, int, int] | None = None
        self._hex = ""

    def of(self, path: Path, stat: os.stat_result) -> str:
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        if key != self._key:
            digest = hashlib.sha256()
            with path.open("rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
            self._key, self._hex = key, digest.hexdigest()
        return self._hex


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError:
        raise ApiError(404, missing_advice(path)) from None


def register(app: QuartTrio, state: ManagementState) -> None:
    if not agent_file().is_file():
        log.warning("%s; GET /agent/%s answers 404", missing_advice(agent_file()), FILE_NAME)
    digests = _Digests()

    @app.get(f"/agent/{FILE_NAME}")
    async def agent_download() -> Response:
        path = agent_file()
        stat = _stat(path)

        async def chunks() -> AsyncIterator[bytes]:
            # Opened here, so a client gone before the body starts leaves no file open.
            async with await trio.open_file(path, "rb") as file:
                while block := await file.read(CHUNK):
                    yield block

        response = Response(chunks(), mimetype="application/octet-stream")
        response.headers["Content-Length"] = str(stat.st_size)
        response.headers["Content-Disposition"] = f'attachment; filename="{FILE_NAME}"'
        return response

    @app.get(f"/agent/{FILE_NAME}.sha256")
    async def agent_sha256() -> Response:
        path = agent_file()
        stat = _stat(path)
        sha = await trio.to_thread.run_sync(digests.of, path, stat)
        return Response(f"{sha}  {FILE_NAME}\n", mimetype="text/plain")
