"""POST/GET /api/v1/files, GET/DELETE /api/v1/files/<sha256>?tenant=T, POST
/api/v1/files/<sha256>/chunks: the files a tenant pushes to its nodes
(oz0/file_blobs.py, docs/files.md)."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import Any, TypedDict, TypeVar

from quart import Response, jsonify, request
from quart_trio import QuartTrio

from oz0 import access, file_blobs
from oz0.node_rules import DEFAULT_TENANT
from oz0.server.api.common import ApiError, ManagementState, json_object, operator
from oz0.server.api.described import described
from oz0_common.file_push import CHUNK, CHUNKS_PER_UPLOAD

T = TypeVar("T")
_SHA256 = {"sha256": {"type": "string", "pattern": "^[0-9a-f]{64}$"}}
_NOT_FOUND = {404: "the tenant has no such file"}


class NewFile(TypedDict):
    tenant: str
    sha256: str
    size: int
    name: str


class Upload(TypedDict):
    """What to upload: chunks of CHUNK bytes, CHUNKS_PER_UPLOAD at most a request."""

    sha256: str
    size: int
    chunk: int
    missing: list[int]
    chunks_per_upload: int


class Chunks(TypedDict):
    tenant: str
    # The first chunk's number.
    seq: int
    # The chunks' bytes in base64 (whole chunks, the file's last one shorter).
    data: str


class Stored(TypedDict):
    complete: bool


class InTenant(TypedDict, total=False):
    tenant: str


class FileShown(file_blobs.FileJson):
    # The newest jobs that push it or place it in their attempts.
    jobs: list[str]


class Deleted(TypedDict):
    sha256: str
    tenant: str
    deleted: bool


class Files(TypedDict):
    files: list[file_blobs.FileJson]


def register(app: QuartTrio, state: ManagementState) -> None:
    @app.post("/api/v1/files")
    @described(
        "Register a file by its SHA-256 and size: the chunks to upload", body=NewFile,
        answers={200: Upload},
    )  # fmt: skip
    async def file_add() -> tuple[Response, int]:
        """Register a file by its SHA-256 and size: answered with the chunks to upload."""
        actor = await operator(state)
        body = await json_object()
        tenant, sha256, size, name = (
            _text(body, "tenant"),
            body.get("sha256"),
            body.get("size"),
            body.get("name"),
        )
        _check(actor, tenant, "push files")
        if not isinstance(sha256, str) or not isinstance(size, int) or not isinstance(name, str):
            raise ApiError(400, "give the file's sha256, size and name")
        missing = await _do(
            state,
            lambda conn: file_blobs.register(conn, tenant, sha256, size, name, actor.actor),
        )
        answer = {"sha256": sha256, "size": size, "chunk": CHUNK, "missing": missing}
        return jsonify({**answer, "chunks_per_upload": CHUNKS_PER_UPLOAD}), 200

    @app.post("/api/v1/files/<sha256>/chunks")
    @described(
        "Upload chunks of a registered file", body=Chunks, answers={200: Stored}, path=_SHA256,
        errors={**_NOT_FOUND, 422: "the whole file does not have its SHA-256"},
    )  # fmt: skip
    async def file_chunk(sha256: str) -> Response:
        """Chunks from SEQ on, {"tenant", "seq", "data": base64}: whole rows, at most
        CHUNKS_PER_UPLOAD (the route's body may be UPLOAD_BODY_SIZE, management.py)."""
        actor = await operator(state)
        body = await json_object()
        tenant, seq = _text(body, "tenant"), body.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise ApiError(400, "seq must be the chunk's number")
        _check(actor, tenant, "push files")
        try:
            data = base64.b64decode(_text(body, "data"), validate=True)
        except (binascii.Error, ValueError):
            raise ApiError(400, "data must be base64") from None
        stored = await _do(
            state, lambda conn: file_blobs.put_chunk(conn, tenant, sha256, seq, data)
        )
        if isinstance(stored, file_blobs.Mismatch):
            raise ApiError(422, str(stored.error()))
        return jsonify({"complete": stored})

    @app.get("/api/v1/files/<sha256>")
    @described(
        "A file of a tenant's", query=InTenant, answers={200: FileShown}, path=_SHA256,
        errors=_NOT_FOUND,
    )  # fmt: skip
    async def file_show(sha256: str) -> Response:
        actor = await operator(state)
        tenant = request.args.get("tenant", DEFAULT_TENANT)
        if not actor.reaches(tenant):
            raise ApiError(404, f"tenant {tenant} has no file {sha256}")

        def read(conn: file_blobs.Conn) -> dict[str, Any]:
            found = file_blobs.get(conn, tenant, sha256)
            return {**found.to_json(), "jobs": file_blobs.jobs_naming(conn, tenant, sha256)}

        return jsonify(await _do(state, read))

    @app.delete("/api/v1/files/<sha256>")
    @described(
        "Delete a tenant's file", query=InTenant, answers={200: Deleted}, path=_SHA256,
        errors=_NOT_FOUND,
    )  # fmt: skip
    async def file_delete(sha256: str) -> Response:
        actor = await operator(state)
        tenant = request.args.get("tenant", DEFAULT_TENANT)
        _check(actor, tenant, "delete files")
        await _do(state, lambda conn: file_blobs.delete(conn, tenant, sha256, actor.actor))
        return jsonify({"sha256": sha256, "tenant": tenant, "deleted": True})

    @app.get("/api/v1/files")
    @described("Files of the tenants one reaches", query=InTenant, answers={200: Files})
    async def file_list() -> Response:
        scope = (await operator(state)).scope
        tenant = request.args.get("tenant")
        tenants: list[str] | None = None if scope is None else list(scope)
        if tenant is not None:
            tenants = [tenant] if tenants is None or tenant in tenants else []
        found = await _do(state, lambda conn: file_blobs.list_files(conn, tenants))
        return jsonify({"files": [f.to_json() for f in found]})


def _text(body: dict[str, Any], name: str) -> str:
    value = body.get(name)
    if not isinstance(value, str) or not value:
        raise ApiError(400, f"give {name}")
    return value


def _check(actor: access.Person, tenant: str, doing: str) -> None:
    try:
        actor.check(access.Right.OPERATE, doing, tenant=tenant)
    except access.Forbidden as e:
        raise ApiError(403, str(e)) from None


async def _do(state: ManagementState, work: Callable[[file_blobs.Conn], T]) -> T:
    try:
        return await state.db.transaction(work)
    except file_blobs.FileError as e:
        raise ApiError(e.status, str(e)) from None
