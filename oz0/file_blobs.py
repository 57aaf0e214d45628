"""Files pushed to nodes, stored in PostgreSQL (issue 43, docs/files.md).

Each content is one blob, named by its SHA-256 and stored once per cluster, in rows of
CHUNK bytes so that any server's edge serves it to the nodes it holds; a tenant's
reference to a blob (`tenant_files`: the name it was pushed as, by whom) is what the
tenant's caps count and what keeps the blob. A blob is uploaded in chunks (`register`
says which are missing, `put_chunk` stores one) and becomes `complete` only once all are
in and their SHA-256 is the one it is named by: only then may a push job name it
(`check_pushable`). A node reads a blob only for a running part of its own whose command
names it (`read_for_node`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, TypedDict

import psycopg
from psycopg.types.json import Jsonb

from oz0 import audit
from oz0.errors import Oz0Error
from oz0.file_blob_cache import BlobCache
from oz0_common.file_push import CHUNK, CHUNKS_PER_UPLOAD, PUSH, is_sha256

Conn = psycopg.Connection[Any]


class FileError(Oz0Error):
    """A file request refused; STATUS the HTTP status it is answered with."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class FileJson(TypedDict):
    """A tenant's file as the API answers it."""

    sha256: str
    size: int
    complete: bool
    tenant: str
    name: str
    created_by: str
    created_at: str


@dataclass(frozen=True)
class StoredFile:
    sha256: str
    size: int
    complete: bool
    tenant: str
    name: str
    created_by: str
    created_at: str

    def to_json(self) -> FileJson:
        return {
            "sha256": self.sha256,
            "size": self.size,
            "complete": self.complete,
            "tenant": self.tenant,
            "name": self.name,
            "created_by": self.created_by,
            "created_at": self.created_at,
        }


def chunks_of(size: int) -> int:
    """How many rows a blob of SIZE bytes takes (an empty one: none)."""
    return -(-size // CHUNK)


def _check_sha(sha256: object) -> str:
    if not is_sha256(sha256):
        raise FileError("a file is named by its SHA-256: 64 lowercase hexadecimal digits")
    assert isinstance(sha256, str)
    return sha256


def register(
    conn: Conn, tenant: str, sha256: str, size: int, name: str, actor: audit.Actor
) -> list[int]:
    """The tenant's reference to blob SHA256 of SIZE bytes, made (within its caps) if it is
    not there; the chunks still missing (none: the blob is complete, nothing to upload)."""
    _check_sha(sha256)
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise FileError("size must be a whole number of bytes")
    row = conn.execute(
        "SELECT max_file_bytes, max_files_bytes FROM tenants WHERE name = %s FOR UPDATE",
        (tenant,),
    ).fetchone()
    if row is None:
        raise FileError(f"tenant {tenant} not found", 404)
    one, total = int(row[0]), int(row[1])
    if size > one:
        raise FileError(
            f"the file is {size} bytes, more than tenant {tenant}'s cap of {one} a file"
            f" (tenant set --max-file-size)",
            413,
        )
    blob = conn.execute(
        "SELECT size, complete FROM file_blobs WHERE sha256 = %s FOR UPDATE", (sha256,)
    ).fetchone()
    if blob is not None and int(blob[0]) != size:
        raise FileError(f"file {sha256} is {blob[0]} bytes, not {size}")
    held = conn.execute(
        "SELECT 1 FROM tenant_files WHERE tenant = %s AND sha256 = %s", (tenant, sha256)
    ).fetchone()
    if held is None:
        used_row = conn.execute(
            "SELECT coalesce(sum(b.size), 0) FROM tenant_files t"
            " JOIN file_blobs b ON b.sha256 = t.sha256 WHERE t.tenant = %s",
            (tenant,),
        ).fetchone()
        used = int(used_row[0]) if used_row is not None else 0
        if used + size > total:
            raise FileError(
                f"tenant {tenant}'s files take {used} bytes; {size} more is past its cap of"
                f" {total} (tenant set --max-files-size, or file delete)",
                429,
            )
    if blob is None:
        conn.execute(
            "INSERT INTO file_blobs (sha256, size, complete) VALUES (%s, %s, %s)",
            (sha256, size, size == 0),
        )
        if size == 0 and sha256 != hashlib.sha256(b"").hexdigest():
            raise FileError(f"an empty file's SHA-256 is not {sha256}")
    conn.execute(
        "INSERT INTO tenant_files (tenant, sha256, name, created_by) VALUES (%s, %s, %s, %s)"
        " ON CONFLICT (tenant, sha256) DO UPDATE SET name = excluded.name, used_at = now()",
        (tenant, sha256, name[:255], f"{actor.kind}:{actor.name}"),
    )
    if held is None:
        audit.record(
            conn, actor, "file.add", sha256, {"name": name[:255], "size": size}, tenants=[tenant]
        )
    if blob is not None and blob[1]:
        return []
    have = {
        int(r[0]) for r in conn.execute("SELECT seq FROM file_chunks WHERE sha256 = %s", (sha256,))
    }
    return [n for n in range(chunks_of(size)) if n not in have]


@dataclass(frozen=True)
class Mismatch:
    """The chunks of a blob hashed to GOT, not its name: dropped, to upload again."""

    got: str
    named: str

    def error(self) -> FileError:
        return FileError(
            f"the chunks uploaded hash to {self.got}, not {self.named}: upload again", 422
        )


def put_chunk(conn: Conn, tenant: str, sha256: str, seq: int, data: bytes) -> bool | Mismatch:
    """Chunk SEQ of blob SHA256 (the tenant's) stored, or with more DATA the chunks from
    SEQ on that it holds (whole rows of CHUNK bytes, the blob's last one shorter); True once
    the blob is complete. The last chunk in checks the whole blob's SHA-256: a mismatch
    drops every chunk and is answered Mismatch (its transaction committed: the chunks go)."""
    _check_sha(sha256)
    row = conn.execute(
        "SELECT b.size, b.complete FROM file_blobs b JOIN tenant_files t"
        " ON t.sha256 = b.sha256 AND t.tenant = %s WHERE b.sha256 = %s FOR UPDATE OF b",
        (tenant, sha256),
    ).fetchone()
    if row is None:
        raise FileError(f"tenant {tenant} has no file {sha256}: register it first", 404)
    size, complete = int(row[0]), bool(row[1])
    if complete:
        return True
    count = chunks_of(size)
    if isinstance(seq, bool) or not isinstance(seq, int) or not 0 <= seq < count:
        raise FileError(f"chunk must be from 0 to {count - 1}")
    end = seq * CHUNK + len(data)
    rows = chunks_of(len(data))
    whole = len(data) % CHUNK == 0 or end == size
    if not data or end > size or not whole or rows > CHUNKS_PER_UPLOAD:
        raise FileError(
            f"chunks from {seq} of {sha256} are whole rows of {CHUNK} bytes (the file's last"
            f" one shorter), at most {CHUNKS_PER_UPLOAD} a request: not {len(data)} bytes"
        )
    with conn.cursor() as cur:
        cur.executemany(
            "INSERT INTO file_chunks (sha256, seq, data) VALUES (%s, %s, %s)"
            " ON CONFLICT DO NOTHING",
            [(sha256, seq + i, data[i * CHUNK : (i + 1) * CHUNK]) for i in range(rows)],
        )
    have_row = conn.execute(
        "SELECT count(*) FROM file_chunks WHERE sha256 = %s", (sha256,)
    ).fetchone()
    if have_row is None or int(have_row[0]) < count:
        return False
    digest = hashlib.sha256()
    with conn.cursor(name=f"blob_{sha256[:16]}") as cur:
        cur.execute("SELECT data FROM file_chunks WHERE sha256 = %s ORDER BY seq", (sha256,))
        for (piece,) in cur:
            digest.update(piece)
    if digest.hexdigest() != sha256:
        conn.execute("DELETE FROM file_chunks WHERE sha256 = %s", (sha256,))
        return Mismatch(digest.hexdigest(), sha256)
    conn.execute("UPDATE file_blobs SET complete = true WHERE sha256 = %s", (sha256,))
    return True


def check_pushable(conn: Conn, tenant: str, sha256: str, size: int) -> None:
    """FileError unless blob SHA256 of SIZE bytes is complete and tenant's."""
    row = conn.execute(
        "SELECT b.size, b.complete FROM file_blobs b JOIN tenant_files t"
        " ON t.sha256 = b.sha256 AND t.tenant = %s WHERE b.sha256 = %s",
        (tenant, sha256),
    ).fetchone()
    if row is None or not row[1]:
        raise FileError(f"tenant {tenant} has no complete file {sha256}: upload it first")
    if int(row[0]) != size:
        raise FileError(f"file {sha256} is {row[0]} bytes, not {size}")


def read_for_node(
    conn: Conn,
    node_id: str,
    job_id: str,
    attempt: int,
    sha256: str,
    offset: int,
    most: int,
    cache: BlobCache | None = None,
) -> tuple[bytes, int] | None:
    """Up to MOST bytes of blob SHA256 from OFFSET, and its size, for NODE_ID's running
    attempt ATTEMPT of job JOB_ID that pushes that blob or places it in its working
    directory; None if there is no such part (a node reads only what it is told to write).
    The rows come from CACHE when it has them (each server reads a blob once for the many
    nodes it serves), else from the database."""
    row = conn.execute(
        "SELECT b.size FROM job_attempts a JOIN jobs j ON j.id = a.job_id"
        " JOIN file_blobs b ON b.sha256 = %s AND b.complete"
        " WHERE a.job_id = %s AND a.number = %s AND a.node_id = %s AND a.state = 'running'"
        " AND ((j.command ->> 0 = %s AND j.command ->> 1 = %s) OR j.files @> %s)",
        (sha256, job_id, attempt, node_id, PUSH, sha256, Jsonb([{"sha256": sha256}])),
    ).fetchone()
    if row is None:
        return None
    size = int(row[0])
    if offset >= size:
        return b"", size
    take = min(most, size - offset)
    first, last = offset // CHUNK, (offset + take - 1) // CHUNK

    def read(low: int, high: int) -> list[bytes]:
        rows = conn.execute(
            "SELECT data FROM file_chunks WHERE sha256 = %s AND seq BETWEEN %s AND %s ORDER BY seq",
            (sha256, low, high),
        ).fetchall()
        return [bytes(r[0]) for r in rows]

    if cache is not None:
        rows = cache.rows(sha256, first, last, chunks_of(size), read)
    else:
        rows = read(first, last)
        rows = rows if len(rows) == last - first + 1 else None
    if rows is None:
        return None
    within = offset - first * CHUNK
    return b"".join(rows)[within : within + take], size


def list_files(conn: Conn, tenants: list[str] | None) -> list[StoredFile]:
    """The files of TENANTS (None: every tenant's), newest first."""
    rows = conn.execute(
        "SELECT b.sha256, b.size, b.complete, t.tenant, t.name, t.created_by, t.created_at"
        " FROM tenant_files t JOIN file_blobs b ON b.sha256 = t.sha256"
        " WHERE %s::text[] IS NULL OR t.tenant = ANY(%s) ORDER BY t.created_at DESC",
        (tenants, tenants),
    ).fetchall()
    return [
        StoredFile(r[0], int(r[1]), bool(r[2]), r[3], r[4], r[5], r[6].isoformat()) for r in rows
    ]


def _named_by_a_job(blob: str) -> str:
    """SQL: a job still names the blob whose SHA-256 is the expression BLOB."""
    return (
        f"(EXISTS (SELECT 1 FROM jobs j WHERE j.command ->> 0 = '{PUSH}'"
        f" AND j.command ->> 1 = {blob})"
        f" OR EXISTS (SELECT 1 FROM jobs j WHERE j.files <> '[]'::jsonb"
        f" AND j.files @> jsonb_build_array(jsonb_build_object('sha256', {blob}))))"
    )


def get(conn: Conn, tenant: str, sha256: str) -> StoredFile:
    """TENANT's file SHA256 (FileError 404 if it has none)."""
    _check_sha(sha256)
    found = [f for f in list_files(conn, [tenant]) if f.sha256 == sha256]
    if not found:
        raise FileError(f"tenant {tenant} has no file {sha256}", 404)
    return found[0]


def jobs_naming(conn: Conn, tenant: str, sha256: str, limit: int = 20) -> list[str]:
    """The newest LIMIT jobs of TENANT that push SHA256 or place it in their attempts."""
    rows = conn.execute(
        "SELECT id FROM jobs WHERE tenant = %s AND ((command ->> 0 = %s AND command ->> 1 = %s)"
        " OR (files <> '[]'::jsonb AND files @> %s)) ORDER BY created_at DESC LIMIT %s",
        (tenant, PUSH, sha256, Jsonb([{"sha256": sha256}]), limit),
    )
    return [str(r[0]) for r in rows]


def delete(conn: Conn, tenant: str, sha256: str, actor: audit.Actor) -> None:
    """TENANT's reference to SHA256 gone (FileError 404 if it had none); the blob itself
    goes with the pruner's next pass once no tenant's reference nor job names it. A job
    queued or running that names it still gets it."""
    _check_sha(sha256)
    gone = conn.execute(
        "DELETE FROM tenant_files WHERE tenant = %s AND sha256 = %s RETURNING name",
        (tenant, sha256),
    ).fetchone()
    if gone is None:
        raise FileError(f"tenant {tenant} has no file {sha256}", 404)
    audit.record(conn, actor, "file.delete", sha256, {"name": gone[0]}, tenants=[tenant])


def prune_unused(conn: Conn, limit: int = 100) -> int:
    """The retention pruner's share (oz0/jobs/pruner.py): a tenant's references not pushed
    for longer than it keeps jobs and that none of its jobs names, then blobs that no
    reference nor job names, with their chunks; at most LIMIT of each. How many blobs."""
    conn.execute(
        "DELETE FROM tenant_files WHERE (tenant, sha256) IN ("
        " SELECT t.tenant, t.sha256 FROM tenant_files t JOIN tenants n ON n.name = t.tenant"
        " WHERE t.used_at < now() - make_interval(secs => n.job_retention_s)"
        f" AND NOT {_named_by_a_job('t.sha256')} LIMIT %s)",
        (limit,),
    )
    return conn.execute(
        "DELETE FROM file_blobs WHERE sha256 IN ("
        " SELECT b.sha256 FROM file_blobs b WHERE NOT EXISTS"
        " (SELECT 1 FROM tenant_files t WHERE t.sha256 = b.sha256)"
        f" AND NOT {_named_by_a_job('b.sha256')} LIMIT %s)",
        (limit,),
    ).rowcount
