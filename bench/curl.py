"""Many API requests at once from one `curl --parallel`: a client nobody here wrote, and one
that costs the machine little next to the server it measures."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from fixtures.tls import as_our_client
from oz0.context import Context


def parallel_posts(
    context: Context,
    urls: list[str],
    body: dict[str, Any],
    write_out: str,
    *,
    max_time: float,
    fail: bool,
) -> list[list[str]]:
    """POST BODY to every one of URLS at once, each on a connection of its own (a full TLS
    handshake with the context's operator certificate); per request, in the order they
    ended, the fields of curl's `--write-out` WRITE_OUT (space-separated). With FAIL, any
    request answered with an error status, or curl failing, raises CalledProcessError."""
    command = ["curl", "--silent", "--parallel", "--parallel-immediate"]
    command += ["--parallel-max", str(len(urls)), "--max-time", f"{max_time:g}"]
    command += ["--cacert", str(context.ca_path), "--cert", str(context.cert_path)]
    command += ["--key", str(context.key_path), "-H", "Content-Type: application/json"]
    command += ["-d", json.dumps(body), "--write-out", write_out + "\\n"]
    if fail:
        command.append("--fail")
    for url in urls:
        # One -o per URL: curl pairs them in order.
        command += ["-o", "/dev/null", *as_our_client(url)]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=max_time + 30, check=fail
    )
    return [line.split() for line in done.stdout.splitlines()]
