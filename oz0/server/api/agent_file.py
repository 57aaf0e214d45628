"""GET /agent/oz0-node and /agent/oz0-node.sha256: the agent file, with no sign-in (it
holds no secret; the join command checks it against the SHA-256 it was given)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import trio
from quart import Response
from quart_trio import QuartTrio

from oz0.agent_file import FILE_NAME, agent_file, missing_advice
from oz0.agent_file.digest import served_sha256
from oz0.server.api.common import ApiError, ManagementState
from oz0.server.api.described import described

log = logging.getLogger(__name__)

CHUNK = 256 * 1024


def _stat(path: Path) -> os.stat_result:
    try:
        return path.stat()
    except OSError:
        raise ApiError(404, missing_advice(path)) from None


def register(app: QuartTrio, state: ManagementState) -> None:
    if not agent_file().is_file():
        log.warning("%s; GET /agent/%s answers 404", missing_advice(agent_file()), FILE_NAME)

    @app.get(f"/agent/{FILE_NAME}")
    @described(
        "The agent file (one executable)", answers={200: "application/octet-stream"},
        errors={404: "this server has no agent file"},
    )  # fmt: skip
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
    @described(
        "The agent file's SHA-256, as sha256sum writes it", answers={200: "text/plain"},
        errors={404: "this server has no agent file"},
    )  # fmt: skip
    async def agent_sha256() -> Response:
        path = agent_file()
        stat = _stat(path)
        sha = await trio.to_thread.run_sync(served_sha256, stat)
        if sha is None:
            raise ApiError(404, missing_advice(path))
        return Response(f"{sha}  {FILE_NAME}\n", mimetype="text/plain")
