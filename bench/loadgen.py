"""Driving the Go load generator `oz0-loadgen` (bench/loadgen/) from a benchmark or test.

    path = build()                                  # bench/loadgen/bin/oz0-loadgen
    result = await join(edge, ca_file, token, out_dir, nodes=1000, concurrency=32)
    async with hold([edge], ca_file, out_dir, extra=["--quiet-events"]) as held:
        async for event in held:                    # one dict per JSON line
            ...
        # leaving the block sends SIGTERM; held.summary is the final line
    answers, summary = posts(ca, cert, key, urls, {"reason": "x"}, timeout=30)
                                                    # synchronous: one POST per URL at once
                                                    # (keep=True: on connections made first)

Events carry `t`, answers `start`, `tls_done` and `end`: CLOCK_MONOTONIC seconds, compare
them with `time.monotonic()`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

SOURCE = Path(__file__).resolve().parent / "loadgen"
BINARY = SOURCE / "bin" / "oz0-loadgen"
# Bounds: a join run ends on its own (every network wait has a deadline); these only
# catch a generator that hangs.
BUILD_TIMEOUT = 300.0
STOP_TIMEOUT = 30.0


class LoadgenError(Exception):
    pass


def build() -> Path:
    """Build oz0-loadgen (quick when it is up to date); its path."""
    done = subprocess.run(
        ["bash", str(SOURCE / "build.sh")], capture_output=True, text=True, timeout=BUILD_TIMEOUT
    )
    if done.returncode != 0:
        raise LoadgenError(f"building oz0-loadgen failed: {done.stderr.strip()}")
    return BINARY


def _edges(edges: Sequence[str]) -> list[str]:
    return [arg for edge in edges for arg in ("--edge", edge)]


async def join(
    edge: str,
    ca_file: Path,
    token: str,
    out_dir: Path,
    *,
    nodes: int,
    concurrency: int = 16,
    labels: dict[str, str] | None = None,
    extra: Sequence[str] = (),
    time_limit: float = 600.0,
) -> dict[str, Any]:
    """Join NODES nodes through EDGE with TOKEN (given through the environment, never
    on the command line); the generator's result (joined, joins_per_s, latency_ms, ...)."""
    args = [str(BINARY), "join", *_edges([edge]), "--ca", str(ca_file), "--out", str(out_dir)]
    args += ["--nodes", str(nodes), "--concurrency", str(concurrency), *extra]
    for key, value in (labels or {}).items():
        args += ["--label", f"{key}={value}"]
    with trio.fail_after(time_limit):
        done = await trio.run_process(
            args,
            env={**os.environ, "OZ0_JOIN_TOKEN": token},
            capture_stdout=True,
            check=False,
        )
    if done.returncode != 0:
        # Its error line went to our stderr, with its progress.
        raise LoadgenError(f"oz0-loadgen join failed with exit status {done.returncode}")
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def posts(
    ca_file: Path,
    cert_file: Path,
    key_file: Path,
    urls: Sequence[str],
    body: dict[str, Any],
    *,
    timeout: float,
    source: str | None = None,
    keep: bool = False,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """POST BODY to every one of URLS at once with `oz0-loadgen posts`, each on a connection
    of its own with a full TLS handshake and the client certificate CERT_FILE (KEY_FILE), as
    that many separate CLI processes would. With KEEP (`--keep`), every connection is opened
    and its handshake done first, not timed, and the requests released together on them once
    all are ready, as a client that keeps its connections (one request each here). Each
    request's line, in the order they ended (`url`, `status`, 0 with `error` when it failed,
    and CLOCK_MONOTONIC stamps `start`, `tls_done`, `end`; with KEEP `start` is the release
    and `tls_done` the same), and the summary (`keep`, `requests`, `ok`, `latency_ms`,
    `tls_ms`: None with KEEP, `warm_s`: the connections' making with KEEP, `cpu_s`: the
    generator's CPU from the requests' release to the last answer). Synchronous: call it
    from a thread in a Trio program. TIMEOUT bounds each request (with KEEP also the
    connections' making, before the release)."""
    args = [str(BINARY), "posts", "--ca", str(ca_file), "--cert", str(cert_file)]
    args += ["--key", str(key_file), "--body", json.dumps(body), "--timeout", f"{timeout:g}"]
    if source is not None:
        args += ["--source", source]
    if keep:
        args.append("--keep")
    for url in urls:
        args += ["--url", url]
    bound = timeout * (2 if keep else 1) + STOP_TIMEOUT
    done = subprocess.run(args, capture_output=True, text=True, timeout=bound)
    if done.returncode != 0:
        raise LoadgenError(
            f"oz0-loadgen posts failed with exit status {done.returncode}: {done.stderr.strip()}"
        )
    answers: list[dict[str, Any]] = []
    summary: dict[str, Any] | None = None
    for line in done.stdout.splitlines():
        parsed: dict[str, Any] = json.loads(line)
        if parsed.get("summary"):
            summary = parsed
        else:
            answers.append(parsed)
    if summary is None:
        raise LoadgenError("oz0-loadgen posts printed no summary")
    return answers, summary


@dataclass
class Held:
    """A running `oz0-loadgen hold`: iterate it for its events (parsed JSON lines)."""

    process: trio.Process
    summary: dict[str, Any] | None = None
    _buffer: bytearray = field(default_factory=bytearray)

    def __aiter__(self) -> Held:
        return self

    async def __anext__(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        while b"\n" not in self._buffer:
            chunk = await self.process.stdout.receive_some(65536)
            if not chunk:
                raise StopAsyncIteration
            self._buffer += chunk
        line, _, rest = self._buffer.partition(b"\n")
        self._buffer = bytearray(rest)
        event: dict[str, Any] = json.loads(line)
        if event.get("event") == "summary":
            self.summary = event
        return event

    async def stop(self) -> dict[str, Any] | None:
        """SIGTERM, then read to the end: the summary line (None if it never came)."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        with trio.move_on_after(STOP_TIMEOUT):
            async for _ in self:
                pass
            await self.process.wait()
        return self.summary


@asynccontextmanager
async def hold(
    edges: Sequence[str],
    ca_file: Path,
    nodes_dir: Path,
    *,
    extra: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> AsyncIterator[Held]:
    """Run `oz0-loadgen hold` for the nodes in NODES_DIR (ENV added to its environment,
    e.g. GOMAXPROCS); stopped (SIGTERM) on exit, killed if it does not end in STOP_TIMEOUT."""
    args = [str(BINARY), "hold", *_edges(edges), "--ca", str(ca_file)]
    args += ["--nodes-dir", str(nodes_dir), *extra]
    process = await trio.lowlevel.open_process(
        args, stdout=subprocess.PIPE, env={**os.environ, **(env or {})}
    )
    held = Held(process)
    try:
        yield held
    finally:
        with trio.CancelScope(shield=True):
            await held.stop()
            if process.returncode is None:
                process.kill()
                await process.wait()
