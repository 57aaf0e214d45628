"""A server's cache of pushed files' rows (oz0/file_blobs.py), read once for many nodes.

A push to N nodes has each node read the same blob from its edge: without a cache, every
piece of it is read from PostgreSQL once per node, N times the file. Here a server reads
a blob's rows a span at a time (SPAN_ROWS rows, 1 MiB), once for every node it holds that
asks for it at about the same time (the first to miss reads it; the others wait for that
read, at most LOAD_WAIT, rather than read it again), and keeps the most recently used
spans up to MAX_BYTES. A blob is named by its SHA-256 and its rows never change once it
is complete (only complete blobs are read for nodes), so a kept span never goes stale;
who may read it is checked on every request all the same (file_blobs.read_for_node).

Called from the edge's database threads, so it holds a lock of its own.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

# The rows read in one statement and kept as one entry: 32 x 32 KiB.
SPAN_ROWS = 32
# What one server keeps at most: three 10 MiB files pushed at once.
MAX_BYTES = 32 << 20
# How long a read waits for another thread's read of the same span before reading it too.
LOAD_WAIT = 10.0

Span = tuple[str, int]
ReadRows = Callable[[int, int], list[bytes] | None]


class BlobCache:
    def __init__(self, max_bytes: int = MAX_BYTES, span_rows: int = SPAN_ROWS) -> None:
        self.max_bytes = max_bytes
        self.span_rows = span_rows
        self._kept: collections.OrderedDict[Span, list[bytes]] = collections.OrderedDict()
        self._bytes = 0
        self._loading: dict[Span, threading.Event] = {}
        self._lock = threading.Lock()
        # Spans read from the database (for tests).
        self.reads = 0

    @property
    def kept_bytes(self) -> int:
        return self._bytes

    def rows(
        self, sha256: str, first: int, last: int, count: int, read: ReadRows
    ) -> list[bytes] | None:
        """Rows FIRST..LAST of blob SHA256 (COUNT rows in all), from the spans kept or read
        with READ(first, last); None if the database did not have them all."""
        out: list[bytes] = []
        size = self.span_rows
        for span in range(first // size, last // size + 1):
            start = span * size
            block = self._span(sha256, span, min(size, count - start), read)
            if block is None:
                return None
            out += block[max(first, start) - start : min(last, start + size - 1) - start + 1]
        return out

    def _span(self, sha256: str, span: int, rows: int, read: ReadRows) -> list[bytes] | None:
        key = (sha256, span)
        with self._lock:
            block = self._kept.get(key)
            if block is not None:
                self._kept.move_to_end(key)
                return block
            loading = self._loading.get(key)
            if loading is None:
                loading = self._loading[key] = threading.Event()
                mine = True
            else:
                mine = False
        if not mine:
            loading.wait(LOAD_WAIT)
            with self._lock:
                block = self._kept.get(key)
                if block is not None:
                    self._kept.move_to_end(key)
                    return block
            # The other read failed or is slow: read it here, without keeping it.
            return self._read(read, span, rows)
        try:
            block = self._read(read, span, rows)
            if block is not None:
                self._keep(key, block)
            return block
        finally:
            with self._lock:
                del self._loading[key]
            loading.set()

    def _read(self, read: ReadRows, span: int, rows: int) -> list[bytes] | None:
        start = span * self.span_rows
        block = read(start, start + rows - 1)
        with self._lock:
            self.reads += 1
        return block if block is not None and len(block) == rows else None

    def _keep(self, key: Span, block: list[bytes]) -> None:
        size = sum(len(row) for row in block)
        if size > self.max_bytes:
            return
        with self._lock:
            if key in self._kept:
                return
            self._kept[key] = block
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, dropped = self._kept.popitem(last=False)
                self._bytes -= sum(len(row) for row in dropped)
