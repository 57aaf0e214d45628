"""The operator of the benchmarks that block, unblock and purge nodes: management API
requests from a process of its own, as the CLI's would be, and what each one changed.

    python -m bench.operator CONTEXT SERVER CONCURRENCY [MODE]

is that process (Api.running starts it): each line on stdin a request, each line on
stdout its answer with when it was sent and answered.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import trio

from bench.measure import percentiles
from bench.runner import wait_until
from cli.client import ApiClient
from fixtures.cluster import REPO, ClusterFiles
from fixtures.edge_client import SimNode
from oz0.context import Context

OPERATOR_START_TIMEOUT = 60.0
OPERATOR_STOP_TIMEOUT = 10.0
API_TIMEOUT = 60.0  # cli.client gives each server 15 s
# How the operator process holds its clients: `learning`, one client for every request that
# learns the other servers as the CLI does; `kept`, one client that does not; `cli`, a new
# client (a new connection, a full TLS handshake) per request, as separate CLI processes.
MODES = ("learning", "kept", "cli")


@dataclass(frozen=True)
class Call:
    """One management API request: when it was sent and answered, and its error if any."""

    requested: float
    answered: float
    error: str | None


def operator_process(context_path: str, server: str, concurrency: str, mode: str) -> None:
    """The operator's side of `Api`: each line on stdin is a request to make through
    cli.client.ApiClient (what `orchestrator-zero node ...` runs), up to CONCURRENCY at a
    time, with the clients of MODE; each answer is a line on stdout with when it was sent
    and answered. A request with `ids` in its body is one multi-ID request."""
    context = dataclasses.replace(Context.load(Path(context_path)), servers=(server,))
    shared = ApiClient(context, learn_servers=mode == "learning")
    printing = threading.Lock()

    def call(request: dict[str, Any]) -> None:
        client = ApiClient(context, learn_servers=False) if mode == "cli" else shared
        requested = time.monotonic()
        error = None
        try:
            client.post(request["path"], request["body"])
        except Exception as e:
            error = f"{type(e).__name__}: {e}"[:200]
        done = {"id": request["id"], "requested": requested, "answered": time.monotonic()}
        if client is not shared:
            client.close()
        with printing:
            print(json.dumps({**done, "error": error}), flush=True)

    print(json.dumps({"ready": True}), flush=True)
    with ThreadPoolExecutor(int(concurrency)) as pool:
        for line in sys.stdin:
            pool.submit(call, json.loads(line))
    shared.close()


class Api:
    """The cluster context's operator, in a process of its own as the CLI would be, so that
    neither its requests nor its time stamps wait for this process's event loop or GIL.
    Both processes stamp with time.monotonic(), the system's one CLOCK_MONOTONIC."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.sending = trio.Lock()
        self.waiting: dict[int, tuple[trio.Event, list[Call]]] = {}
        self.last_id = 0
        self.ready = trio.Event()

    @classmethod
    @asynccontextmanager
    async def running(
        cls,
        files: ClusterFiles,
        server: str,
        concurrency: int,
        mode: str = "learning",
    ) -> AsyncIterator[Api]:
        """The operator process, `python -m bench.operator CONTEXT SERVER CONCURRENCY MODE`,
        sending to SERVER (HOST:PORT of a management API)."""
        command = [sys.executable, "-m", "bench.operator"]
        command += [str(files.context_path), server, str(concurrency), mode]
        process = await trio.lowlevel.open_process(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        api = cls(process)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(api._read_answers)
                with trio.fail_after(OPERATOR_START_TIMEOUT):
                    await api.ready.wait()
                yield api
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                if process.stdin is not None:
                    await process.stdin.aclose()  # the operator process ends at EOF
                with trio.move_on_after(OPERATOR_STOP_TIMEOUT):
                    await process.wait()
                if process.returncode is None:
                    process.kill()
                    await process.wait()

    async def _read_answers(self) -> None:
        assert self.process.stdout is not None
        pending = b""
        async for chunk in self.process.stdout:
            *lines, pending = (pending + chunk).split(b"\n")
            for line in lines:
                answer = json.loads(line)
                if answer.get("ready"):
                    self.ready.set()
                    continue
                event, slot = self.waiting.pop(int(answer["id"]))
                slot.append(Call(answer["requested"], answer["answered"], answer["error"]))
                event.set()
        raise RuntimeError(f"the operator process exited ({self.process.poll()})")

    async def post(self, path: str, body: dict[str, Any]) -> Call:
        self.last_id += 1
        event, slot = trio.Event(), list[Call]()
        self.waiting[self.last_id] = (event, slot)
        request = json.dumps({"id": self.last_id, "path": path, "body": body}) + "\n"
        assert self.process.stdin is not None
        async with self.sending:
            await self.process.stdin.send_all(request.encode())
        with trio.fail_after(API_TIMEOUT):
            await event.wait()
        return slot[0]


@dataclass(eq=False)
class Change:
    """A block, unblock or purge of one node, and when its effect was seen."""

    node: SimNode
    mode: str
    edge: str | None
    call: Call | None = None

    def on_server(self, address: str) -> bool:
        """Whether the node streamed to the server at ADDRESS when it was chosen."""
        return self.edge is not None and self.edge.startswith(f"{address}:")


def block_seen(change: Change) -> float | None:
    assert change.call is not None
    after = change.call.requested
    return next((c.at for c in change.node.cuts if c.at >= after and c.code == "blocked"), None)


def welcome_seen(change: Change) -> float | None:
    assert change.call is not None
    return next((t for t in change.node.welcomes if t >= change.call.requested), None)


def forgotten_seen(change: Change) -> float | None:
    return change.node.forgotten_at


Effect = Callable[[Change], float | None]


async def change_nodes(
    api: Api,
    changes: list[Change],
    path: str,
    body: dict[str, Any],
    effect: Effect,
    *,
    burst: int,
    wait: float,
) -> None:
    """Send the requests of CHANGES: one at a time, each waiting up to WAIT for its effect
    (burst 1), or BURST at once, each burst waiting for all its effects (burst > 1)."""

    async def one(change: Change) -> None:
        change.call = await api.post(path.format(node_id=change.node.node_id), body)

    for start in range(0, len(changes), burst):
        group = changes[start : start + burst]
        async with trio.open_nursery() as nursery:
            for change in group:
                nursery.start_soon(one, change)
        await wait_until(partial(all_done, group, effect), wait)


def all_done(changes: list[Change], effect: Effect) -> bool:
    """Whether every change that was sent failed or has had its effect."""
    return all(c.call is None or c.call.error or effect(c) is not None for c in changes)


async def send_one_after_another(
    api: Api, changes: list[Change], path: str, body: dict[str, Any]
) -> None:
    """Each request as soon as the previous one was answered, not waiting for effects."""
    for change in changes:
        change.call = await api.post(path.format(node_id=change.node.node_id), body)


def summary(changes: list[Change], effect: Effect, slow: float) -> dict[str, Any]:
    """Latencies from each request, and from its answer, to its effect; API call times."""
    from_request, from_answer, api, errors = [], [], [], Counter[str]()
    missing = []
    for change in changes:
        call = change.call
        if call is None:
            errors["not sent"] += 1
            continue
        api.append(call.answered - call.requested)
        if call.error is not None:
            errors[call.error.split(":")[0]] += 1
            continue
        seen = effect(change)
        if seen is None:
            missing.append(change.node.node_id)
            continue
        from_request.append(seen - call.requested)
        from_answer.append(seen - call.answered)
    return {
        "n": len(changes),
        "seen": len(from_request),
        "not_seen": len(missing),
        "not_seen_nodes": missing[:10],
        "api_errors": dict(errors),
        "request_to_effect_ms": percentiles(from_request),
        "answer_to_effect_ms": percentiles(from_answer),
        "api_call_ms": percentiles(api),
        f"over_{slow:g}s": sum(t > slow for t in from_request),
    }


def split_summary(
    changes: list[Change], effect: Effect, slow: float, api_address: str
) -> dict[str, Any]:
    """summary() of all CHANGES, and of those whose node streamed to the API's server
    (API_ADDRESS) and to the others apart."""
    on_api = [c for c in changes if c.on_server(api_address)]
    elsewhere = [c for c in changes if not c.on_server(api_address)]
    return {
        "all": summary(changes, effect, slow),
        "node_on_api_server": summary(on_api, effect, slow),
        "node_on_other_servers": summary(elsewhere, effect, slow),
    }


if __name__ == "__main__":
    match sys.argv[1:]:
        case [context_path, server, concurrency, *rest] if len(rest) < 2 and set(rest) <= {*MODES}:
            operator_process(context_path, server, concurrency, rest[0] if rest else "learning")
        case _:
            sys.exit(
                f"usage: python -m bench.operator CONTEXT SERVER CONCURRENCY [{'|'.join(MODES)}]"
            )
