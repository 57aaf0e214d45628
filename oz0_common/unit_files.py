"""Installing a systemd unit file (`oz0-node install-service`, `server install-service`)."""

from __future__ import annotations

from pathlib import Path

from oz0_common.errors import Oz0Error
from oz0_common.files import write_private


def install(unit_path: Path, text: str, *, force: bool) -> None:
    """Write TEXT to UNIT_PATH; an existing different unit only with FORCE. Oz0Error (one
    line) when it cannot be read or written."""
    try:
        current = unit_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        current = None
    except OSError as e:
        raise Oz0Error(f"cannot read {unit_path}: {e.strerror or e}") from None
    if current is not None and current != text and not force:
        raise Oz0Error(f"{unit_path} exists and differs; give --force to replace it")
    try:
        unit_path.parent.mkdir(parents=True, exist_ok=True)
        write_private(unit_path, text.encode())
        unit_path.chmod(0o644)  # systemd reads it; it holds no secret
    except OSError as e:
        raise Oz0Error(f"cannot write {unit_path}: {e.strerror or e}") from None
