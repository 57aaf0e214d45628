"""What each node said of a file push (`file push`, `job show`): its job's output, one line
per attempt (oz0_node/jobs/file_push.py)."""

from __future__ import annotations

import base64
from typing import Any

from cli.client import TIMEOUT, ApiClient


def push_results(client: ApiClient, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Per attempt of push JOB, its node and the line its agent reported (written,
    unchanged, error: ...), from the job's output."""
    said: dict[int, bytes] = {}
    after = 0
    while True:
        page = client.get(
            f"/api/v1/jobs/{job['id']}/output", {"after": after}, read_timeout=TIMEOUT
        )
        for c in page["chunks"]:
            said[c["attempt"]] = said.get(c["attempt"], b"") + base64.b64decode(c["data"])
        after = page["cursor"]
        if not page["more"]:
            break
    results = []
    for a in job["attempts"]:
        text = said.get(a["number"], b"").decode("utf-8", "replace").strip()
        if not text:
            text = a.get("ended_because") or a["state"]
        results.append({"node": a["node"], "attempt": a["number"], "result": text})
    return results
