"""The output nodes send: each attempt's chunks stored up to its cap (the edge,
oz0/server/edge/output_writes.py), and read back a page at a time (the API, `job logs`,
the web UI, follow.py), each page bounded in chunks and bytes."""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TypedDict

from oz0.jobs.store._followers import tell_followers
from oz0.jobs.store._records import Conn

# Raw output kept per attempt (stdout and stderr together); the rest is dropped, marked.
OUTPUT_CAP = 1024 * 1024
MAX_CHUNK = 32 * 1024
# One page of output, whoever reads it (the API, `job logs`, the web UI): at most this many
# chunks (PAGE_CHUNKS unless asked otherwise) and this many bytes, so that a node that sent
# many tiny chunks cannot make one read unbounded.
PAGE_CHUNKS = 500
MAX_PAGE_CHUNKS = 1000
PAGE_BYTES = OUTPUT_CAP


def append_output(
    conn: Conn,
    node_id: str,
    job_id: str,
    attempt: int,
    seq: int,
    stream: str,
    data: bytes,
    truncated: bool,
) -> bool:
    """Store a chunk a node sent; False if that attempt no longer runs on that node.

    What goes past OUTPUT_CAP is dropped: the chunk that reaches it (or the node's own
    `truncated` mark) is stored cut, as the attempt's one truncation mark, and every chunk
    after it is acknowledged (True) but stores nothing, whatever its seq. An empty chunk
    that marks nothing stores nothing either (an honest node sends none). A chunk sent
    again (same seq) is stored once. So a node, hostile or not, adds at most one row per
    byte of the cap, plus the mark, to an attempt.

    One job's chunks are written one transaction at a time (a lock of the job's own, held
    to the commit), so they commit in the order of their IDs: a reader's cursor (the last
    ID it has seen) never passes a chunk of that job still to commit. Without it, the parts
    of an `--all` job committing out of ID order made a follower skip chunks.
    """
    conn.execute("SELECT pg_advisory_xact_lock(hashtext('oz0.jobs.output:' || %s))", (job_id,))
    row = conn.execute(
        "SELECT state, node_id, output_bytes, truncated FROM job_attempts"
        " WHERE job_id = %s AND number = %s FOR UPDATE",
        (job_id, attempt),
    ).fetchone()
    if row is None or row[0] != "running" or row[1] != node_id:
        return False
    if row[3]:
        return True  # past the mark: acknowledged, so the node moves on; nothing kept
    room = max(0, OUTPUT_CAP - int(row[2]))
    if len(data) > room:
        data, truncated = data[:room], True
    if not data and not truncated:
        return True
    stored = conn.execute(
        "INSERT INTO job_output (job_id, attempt, seq, stream, data, truncated)"
        " VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING id",
        (job_id, attempt, seq, stream, data, truncated),
    ).fetchone()
    if stored is not None:
        conn.execute(
            "UPDATE job_attempts SET output_bytes = output_bytes + %s,"
            " truncated = truncated OR %s WHERE job_id = %s AND number = %s",
            (len(data), truncated, job_id, attempt),
        )
        tell_followers(conn, job_id)
    return True


class ChunkJson(TypedDict):
    """A chunk of output as the API answers it: its bytes in base64."""

    cursor: int
    attempt: int
    node: str
    stream: str
    data: str
    truncated: bool


@dataclass(frozen=True)
class Chunk:
    cursor: int
    attempt: int
    node: str
    stream: str
    data: bytes
    truncated: bool

    def to_json(self) -> ChunkJson:
        """As the API and the web UI's job page send it: the bytes in base64."""
        return {
            "cursor": self.cursor,
            "attempt": self.attempt,
            "node": self.node,
            "stream": self.stream,
            "data": base64.b64encode(self.data).decode(),
            "truncated": self.truncated,
        }


@dataclass(frozen=True)
class OutputPage:
    """Chunks in order; `more`: the page stopped at one of its bounds, and the next page
    (after the last chunk's cursor) has more right away."""

    chunks: list[Chunk]
    more: bool

    @property
    def cursor(self) -> int | None:
        return self.chunks[-1].cursor if self.chunks else None


def output_page(
    conn: Conn,
    job_id: str,
    *,
    after: int = 0,
    attempt: int | None = None,
    limit: int = PAGE_CHUNKS,
    max_bytes: int = PAGE_BYTES,
) -> OutputPage:
    """The chunks after cursor AFTER: at most LIMIT of them (1 to MAX_PAGE_CHUNKS) and at
    most MAX_BYTES bytes of output together (but always one chunk, if there is one), so
    that no page costs more than that, however many rows a node made.

    The window sums the bytes in cursor order over at most LIMIT + 1 rows; those past a
    bound come back without their data and only say that there is more.
    """
    limit = max(1, min(limit, MAX_PAGE_CHUNKS))
    rows = conn.execute(
        "SELECT id, attempt, node_id, stream,"
        "   CASE WHEN kept THEN data ELSE ''::bytea END, truncated, kept"
        " FROM (SELECT *, n = 1 OR (n <= %(limit)s AND upto <= %(bytes)s) AS kept"
        "   FROM (SELECT o.id, o.attempt, a.node_id, o.stream, o.data, o.truncated,"
        "       row_number() OVER w AS n, sum(octet_length(o.data)) OVER w AS upto"
        "     FROM job_output o"
        "     JOIN job_attempts a ON a.job_id = o.job_id AND a.number = o.attempt"
        "     WHERE o.job_id = %(job)s AND o.id > %(after)s"
        "       AND (%(attempt)s::int IS NULL OR o.attempt = %(attempt)s)"
        "     WINDOW w AS (ORDER BY o.id)"
        "     ORDER BY o.id LIMIT %(limit)s + 1) AS window_rows) AS page"
        " ORDER BY id",
        {"job": job_id, "after": after, "attempt": attempt, "limit": limit, "bytes": max_bytes},
    ).fetchall()
    chunks = [Chunk(r[0], r[1], r[2], r[3], bytes(r[4]), r[5]) for r in rows if r[6]]
    return OutputPage(chunks, more=len(chunks) < len(rows))
