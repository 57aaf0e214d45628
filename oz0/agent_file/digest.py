"""The served agent file's SHA-256, computed once per version of the file: the download's
`.sha256` and every join command (oz0.server.join_command) give the same one."""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

from oz0.agent_file import agent_file


class FileDigest:
    """A file's SHA-256, computed again only when the file changes (inode, size, mtime)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._key: tuple[int, int, int] | None = None
        self._hex = ""

    def of(self, path: Path, stat: os.stat_result) -> str:
        key = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        # Threads call this (trio.to_thread): one reads the file, the others wait for it.
        with self._lock:
            if key != self._key:
                digest = hashlib.sha256()
                with path.open("rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        digest.update(block)
                self._key, self._hex = key, digest.hexdigest()
            return self._hex


_SERVED = FileDigest()


def served_sha256(stat: os.stat_result | None = None) -> str | None:
    """The SHA-256 of the file this server serves (blocking: call it in a thread); None
    when there is no file to serve."""
    path = agent_file()
    try:
        return _SERVED.of(path, stat or path.stat())
    except OSError:
        return None
