"""Files holding secrets: written whole or not at all, 0600 from their first byte."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_private(path: Path, data: bytes, *, sync: bool = True) -> None:
    """Replace PATH with DATA atomically; the file is 0600 from its first byte. SYNC: on
    the disk before it replaces PATH (what must outlive a crash of the machine, not only of
    a process)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
