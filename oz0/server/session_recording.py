"""A live session's recording (oz0/node_sessions.py keeps it): asciicast v2 events, written
to PostgreSQL in sealed chunks as they happen.

Output is written before it is shown (`record_output`, then the relay sends it): the
relay takes whatever output has arrived meanwhile into one chunk, so a session's output
costs one transaction per batch, not per piece, and a server killed at any moment has
lost nothing a person saw. Input (when the cluster records it) and resizes wait for the
next chunk (or the end).
"""

from __future__ import annotations

import codecs
import json
from functools import partial

import trio

from oz0 import node_sessions
from oz0.store.pool import Database

# A chunk holds at most this many event lines' worth of text (its events are never split).
CHUNK_TEXT = 256 * 1024


class Recording:
    def __init__(
        self,
        db: Database,
        master_key: bytes,
        cluster: str,
        session_id: str,
        *,
        records_input: bool,
    ) -> None:
        self._db = db
        self._key = master_key
        self._cluster = cluster
        self.session_id = session_id
        self.records_input = records_input
        self._began = trio.current_time()
        self._events: list[str] = []
        self._seq = 0
        self.input_bytes = 0
        self.output_bytes = 0
        # Bytes of a UTF-8 character split between two reads wait for the rest.
        self._out = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._in = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._writing = trio.Lock()

    def _event(self, code: str, text: str) -> None:
        if text:
            at = round(trio.current_time() - self._began, 6)
            self._events.append(json.dumps([at, code, text]) + "\n")

    def output(self, data: bytes) -> None:
        self.output_bytes += len(data)
        self._event("o", self._out.decode(data))

    def input(self, data: bytes) -> None:
        self.input_bytes += len(data)
        if self.records_input:
            self._event("i", self._in.decode(data))

    def resize(self, rows: int, cols: int) -> None:
        self._event("r", f"{cols}x{rows}")

    async def flush(self) -> None:
        """Write what was recorded since the last flush, as one chunk or a few."""
        async with self._writing:
            events, self._events = self._events, []
            for text in _chunks(events):
                self._seq += 1
                seq = self._seq
                sealed = node_sessions.seal_chunk(
                    self._key, self._cluster, self.session_id, seq, text
                )
                ins, outs = self.input_bytes, self.output_bytes
                await self._db.transaction(
                    partial(node_sessions.add_chunk, session_id=self.session_id, seq=seq,
                            sealed=sealed, input_bytes=ins, output_bytes=outs)
                )  # fmt: skip


def _chunks(events: list[str]) -> list[str]:
    """EVENTS (lines) joined into texts of about CHUNK_TEXT at most (a longer line alone)."""
    chunks: list[str] = []
    taken: list[str] = []
    size = 0
    for line in events:
        if taken and size + len(line) > CHUNK_TEXT:
            chunks.append("".join(taken))
            taken, size = [], 0
        taken.append(line)
        size += len(line)
    if taken:
        chunks.append("".join(taken))
    return chunks
