"""A local file stored in the cluster for pushes (`file push`, `job run --file`): hashed,
registered, and only the chunks the cluster lacks sent (oz0/server/api/files.py)."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

from cli.client import ApiClient
from cli.job_params import usage_error
from oz0_common.file_push import CHUNK, BadPush, check_name


def upload(client: ApiClient, tenant: str, source: Path) -> tuple[str, int]:
    """SOURCE stored in the cluster (only the chunks it lacks): its SHA-256 and size."""
    digest, size = hashlib.sha256(), 0
    with source.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    sha256 = digest.hexdigest()
    answer = client.post(
        "/api/v1/files", {"tenant": tenant, "sha256": sha256, "size": size, "name": source.name}
    )
    chunk = int(answer.get("chunk", CHUNK))
    # A server before uploads of several rows a request takes one (and says nothing).
    per_upload = max(1, int(answer.get("chunks_per_upload", 1)))
    with source.open("rb") as f:
        for seq, rows in runs(answer["missing"], per_upload):
            f.seek(seq * chunk)
            data = f.read(chunk * rows)
            client.post(
                f"/api/v1/files/{sha256}/chunks",
                {"tenant": tenant, "seq": seq, "data": base64.b64encode(data).decode("ascii")},
            )
    return sha256, size


def runs(missing: list[int], most: int) -> list[tuple[int, int]]:
    """MISSING rows (ascending) as (first, count) runs of consecutive rows, MOST at most."""
    out: list[tuple[int, int]] = []
    for seq in missing:
        if out and out[-1][0] + out[-1][1] == seq and out[-1][1] < most:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((seq, 1))
    return out


def placed_files(client: ApiClient, tenant: str, specs: list[str]) -> list[dict[str, Any]]:
    """`job run --file SRC[:NAME]`s uploaded: the job's `files`."""
    files = []
    for spec in specs:
        source, _, name = spec.partition(":")
        path = Path(source)
        name = name or path.name
        try:
            check_name(name)
        except BadPush as e:
            raise usage_error(f"--file {spec}: {e}") from None
        if not path.is_file():
            raise usage_error(f"--file {spec}: {source} is not a file")
        sha256, size = upload(client, tenant, path)
        files.append({"sha256": sha256, "size": size, "name": name})
    return files
