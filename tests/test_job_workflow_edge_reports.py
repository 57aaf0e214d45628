"""Attempts that outlive their stream: the edge reports for the node, through a real
server's edge and scripted nodes, run by a real Temporal (one server on 127.0.0.196, the
module's own: the files of the job workflow's tests share the address, so they run one
after another).

The workflow runs in a test worker in a namespace of the tests' own with fake database
steps and fake nodes (fixtures/job_workflow_fakes.py), there only to inject faults;
Temporal, its timeouts, cancellations and signals are real.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import queue
import secrets
import threading
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import trio
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker
from trio_websocket import WebSocketConnection

from cli.client import ApiClient
from fixtures import edge_client
from fixtures.cluster import Served
from fixtures.job_workflow_fakes import (
    JOB_BOUND,
    SEEN_BOUND,
    SERVER,
    TEMPORAL,
    Result,
)
from fixtures.temporal import Credentials, run_async, server_credentials
from oz0.context import Context
from oz0.jobs import workflow as wf
from oz0_common.attempt_heartbeat import HEARD
from tests.conftest import CliRunner, create_token

ADVERTISE = SERVER  # the module's one server (`served`, tests/conftest.py)


# --- attempts that outlive their stream: the edge reports for the node -----------------------
#
# The module's real server, its real job worker and database, in the `default` tenant: a
# scripted node (fixtures.edge_client, the real protocol and certificate) holds a control
# stream, and a Temporal worker on its queue takes each attempt and completes it
# asynchronously, as the node hands an attempt to its supervisor; from then on only what
# the node says on its stream (attempt_alive, attempt_done) reaches Temporal, by the edge.

EDGE = f"{SERVER}:7443"
# What a node's attempt returns when its command exited 0 (oz0_node/jobs/attempt.py).
EXIT_0 = {
    "exit_code": 0, "signal": None, "ended_because": "exit", "output_bytes": 0,
    "truncated": False, "output_complete": True,
}  # fmt: skip
# The shortest lost-after the API takes: these tests wait it out.
LOST_AFTER = 5.0


class NodeQueue:
    """A scripted node's Temporal worker (in a thread of its own, on asyncio): each attempt
    taken off the node's queue is noted, then completed asynchronously."""

    def __init__(self, node_id: str, creds: Credentials) -> None:
        self.node_id, self.creds = node_id, creds
        self.taken: queue.Queue[tuple[str, dict[str, Any]]] = queue.Queue()
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    def __enter__(self) -> NodeQueue:
        self._thread.start()
        assert self._ready.wait(SEEN_BOUND), "the node's worker did not start"
        return self

    def __exit__(self, *_: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(SEEN_BOUND)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        client = await Client.connect(TEMPORAL, namespace="default", tls=self.creds.tls())

        @activity.defn(name=wf.NODE_ACTIVITY)
        async def attempt(payload: dict[str, Any]) -> Result:
            # As the node's activity: heard at once, then handed over (which takes the
            # node a while: the heartbeat leaves meanwhile), completed by the edge.
            activity.heartbeat(HEARD)
            await asyncio.sleep(0.2)
            self.taken.put((activity.info().activity_id, payload))
            activity.raise_complete_async()

        async with Worker(client, task_queue=self.node_id, activities=[attempt]):
            self._ready.set()
            await self._stop.wait()

    async def next_attempt(self) -> tuple[str, dict[str, Any]]:
        return await trio.to_thread.run_sync(lambda: self.taken.get(timeout=SEEN_BOUND))


class StreamNode:
    """A scripted node's control stream: what it sends, and what the edge answers it."""

    def __init__(self, keys: edge_client.NodeKeys, ws: WebSocketConnection) -> None:
        self.keys, self.ws = keys, ws
        self._answers: dict[str, list[dict[str, Any]]] = {
            "attempt_stop": [],
            "attempt_done_ack": [],
        }
        self._arrived = trio.Event()

    @property
    def node_id(self) -> str:
        return self.keys.node_id

    async def run(self) -> None:
        """Read what comes; say something every second (a silent node's stream is ended)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._pulse)
            while True:
                message = await edge_client.receive(self.ws)
                if message["type"] in self._answers:
                    self._answers[message["type"]].append(message)
                    self._arrived.set()

    async def _pulse(self) -> None:
        while True:
            await edge_client.send(self.ws, "heartbeat")
            await trio.sleep(1)

    async def alive(self, *attempts: tuple[str, int]) -> None:
        await edge_client.send(
            self.ws, "attempt_alive", attempts=[{"job": j, "attempt": n} for j, n in attempts]
        )

    async def done(self, job: str, number: int, **outcome: Any) -> dict[str, Any]:
        """Send attempt_done; the edge's ack."""
        await edge_client.send(self.ws, "attempt_done", job=job, attempt=number, **outcome)
        return await self.next("attempt_done_ack")

    async def next(self, kind: str, within: float = SEEN_BOUND) -> dict[str, Any]:
        with trio.fail_after(within):
            while not self._answers[kind]:
                self._arrived = trio.Event()
                await self._arrived.wait()
        return self._answers[kind].pop(0)

    def said(self, kind: str) -> list[dict[str, Any]]:
        return list(self._answers[kind])


@contextlib.asynccontextmanager
async def scripted_nodes(
    cli: CliRunner, served: Served, count: int
) -> AsyncIterator[tuple[list[StreamNode], list[NodeQueue], str]]:
    """COUNT nodes joined (accepted at once, labelled with a tag of the test's own), each
    with its stream and its queue's worker; and the tag."""
    tag = secrets.token_hex(3)
    token = await trio.to_thread.run_sync(
        lambda: create_token(cli, served.files.cli_env, "--max-uses", "0")
    )
    ca_pem, _ = await edge_client.fetch_ca(EDGE)
    creds = server_credentials(served.files)
    with contextlib.ExitStack() as workers:
        async with trio.open_nursery() as nursery, contextlib.AsyncExitStack() as streams:
            nodes, queues = [], []
            for _ in range(count):
                keys = edge_client.NodeKeys.new()
                keys.ca_pem = ca_pem
                joined = await edge_client.join(EDGE, keys, token=token, labels={"suite": tag})
                assert joined["state"] == "accepted", joined
                ws, first = await streams.enter_async_context(edge_client.control(EDGE, keys))
                assert first["type"] == "welcome", first
                node = StreamNode(keys, ws)
                nursery.start_soon(node.run)
                nodes.append(node)
                queues.append(workers.enter_context(NodeQueue(keys.node_id, creds)))
            yield nodes, queues, tag
            nursery.cancel_scope.cancel()


async def job_run(cli: CliRunner, served: Served, *args: str) -> str:
    ran = await trio.to_thread.run_sync(
        lambda: cli(
            "job", "run", "--detach", "--json", *args, "--", "true", env=served.files.cli_env
        )
    )
    assert ran.code == 0, ran.err
    return str(ran.json()["id"])


async def job_when(
    served: Served, job_id: str, done: Callable[[dict[str, Any]], bool], within: float = JOB_BOUND
) -> dict[str, Any]:
    client = ApiClient(Context.load(served.files.context_path))
    with trio.fail_after(within):
        while True:
            job: dict[str, Any] = await trio.to_thread.run_sync(
                lambda: client.get(f"/api/v1/jobs/{job_id}")
            )
            if done(job):
                return job
            await trio.sleep(0.1)


async def test_attempt_alive_keeps_a_handed_off_attempt_running_and_attempt_done_ends_it(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 2) as ([ours, other], [queue_, _], _tag):
        job_id = await job_run(cli, served, "--node", ours.node_id, "--lost-after", "5s")
        activity_id, payload = await queue_.next_attempt()
        assert activity_id == "attempt-1" and payload["job_id"] == job_id
        # Another node of the tenant reporting on it is told it is not its to run.
        await other.alive((job_id, 1))
        assert await other.next("attempt_stop") == {
            "type": "attempt_stop", "job": job_id, "attempt": 1, "why": "ended",
        }  # fmt: skip
        ack = await other.done(job_id, 1, result={**EXIT_0, "exit_code": 9})
        assert (ack["stored"], ack["reason"]) == (False, "ended")
        # Past its lost-after, heard of through the edge only.
        for _ in range(int(LOST_AFTER) + 2):
            await ours.alive((job_id, 1))
            await trio.sleep(1)
        assert ours.said("attempt_stop") == []
        job = await job_when(served, job_id, lambda j: True)
        assert job["state"] == "running" and len(job["attempts"]) == 1

        ack = await ours.done(job_id, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (True, None)
        job = await job_when(served, job_id, lambda j: j["state"] == "succeeded")
        assert job["exit_code"] == 0 and [a["ended_because"] for a in job["attempts"]] == ["exit"]
        # The same again (its ack lost): nothing is left to complete.
        ack = await ours.done(job_id, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (False, "ended")


def last_heartbeat(served: Served, job_id: str) -> dt.datetime | None:
    """When Temporal last recorded a heartbeat of the job's pending attempt."""

    async def describe() -> dt.datetime | None:
        client = await Client.connect(
            TEMPORAL, namespace="default", tls=server_credentials(served.files).tls()
        )
        described = await client.get_workflow_handle(job_id).describe()
        [pending] = described.raw_description.pending_activities
        if not pending.HasField("last_heartbeat_time"):
            return None
        return pending.last_heartbeat_time.ToDatetime()

    return run_async(describe)


async def test_the_edge_heartbeats_an_attempt_once_a_quarter_of_its_lost_after(
    cli: CliRunner, served: Served
) -> None:
    # Temporal writes each heartbeat to the workflow's shard: a node that says alive four
    # times a second (it says so every second) gets one every 2 s with an 8 s lost-after.
    async with scripted_nodes(cli, served, 1) as ([node], [queue_], _tag):
        job_id = await job_run(cli, served, "--node", node.node_id, "--lost-after", "8s")
        await queue_.next_attempt()
        seen: set[dt.datetime] = set()
        began = time.monotonic()
        while time.monotonic() - began < 6.0:
            await node.alive((job_id, 1))
            await trio.sleep(0.25)
            beat = await trio.to_thread.run_sync(last_heartbeat, served, job_id)
            if beat is not None:
                seen.add(beat)
        ack = await node.done(job_id, 1, result=EXIT_0)
    assert 2 <= len(seen) <= 4, sorted(seen)
    assert ack["stored"] is True


async def test_a_cancelled_job_s_attempt_is_told_to_stop_at_its_next_attempt_alive(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 1) as ([node], [queue_], _tag):
        job_id = await job_run(cli, served, "--node", node.node_id)
        await queue_.next_attempt()
        await node.alive((job_id, 1))
        cancelled = await trio.to_thread.run_sync(
            lambda: cli("job", "cancel", job_id, env=served.files.cli_env)
        )
        assert cancelled.code == 0, cancelled.err
        with trio.fail_after(SEEN_BOUND):
            while not node.said("attempt_stop"):
                await node.alive((job_id, 1))
                await trio.sleep(0.5)
        assert node.said("attempt_stop")[0]["why"] == "cancelled"
        job = await job_when(served, job_id, lambda j: j["state"] == "cancelled")
        assert [a["ended_because"] for a in job["attempts"]] == ["cancelled"]


async def test_a_lost_node_s_job_ends_lost_with_on_lost_fail_and_moves_by_default(
    cli: CliRunner, served: Served
) -> None:
    async with scripted_nodes(cli, served, 2) as ([a, b], [queue_a, queue_b], tag):
        failing = await job_run(
            cli, served, "--node", a.node_id, "--on-lost", "fail", "--lost-after", "5s"
        )
        await queue_a.next_attempt()
        moving = await job_run(cli, served, "--selector", f"suite={tag}", "--lost-after", "5s")
        # The least busy node takes it: b (a runs the first job).
        _, payload = await queue_b.next_attempt()
        assert payload["job_id"] == moving

        failed = await job_when(served, failing, lambda j: j["state"] == "lost")
        assert failed["reason"] == (f"node {a.node_id} was lost for more than 5 s (--on-lost fail)")
        assert len(failed["attempts"]) == 1

        _, payload = await queue_a.next_attempt()  # moved: b was lost to it
        assert (payload["job_id"], payload["attempt"]) == (moving, 2)
        job = await job_when(served, moving, lambda j: True)
        assert [(x["node"], x["ended_because"]) for x in job["attempts"]] == [
            (b.node_id, "node lost"), (a.node_id, None),
        ]  # fmt: skip
        # b comes back: its copy is to stop, and its outcome is not taken.
        await b.alive((moving, 1))
        assert (await b.next("attempt_stop"))["why"] == "ended"
        ack = await b.done(moving, 1, result=EXIT_0)
        assert (ack["stored"], ack["reason"]) == (False, "ended")
        await a.alive((failing, 1))
        assert (await a.next("attempt_stop"))["why"] == "ended"

        # A failure reaches the workflow with the node's type and message.
        refusal = {"type": wf.ATTEMPT_REFUSED, "message": "its grant does not hold"}
        ack = await a.done(moving, 2, failure=refusal)
        assert (ack["stored"], ack["reason"]) == (True, None)
        job = await job_when(served, moving, lambda j: j["state"] == "failed")
        assert job["reason"] == f"node {a.node_id} refused attempt 2: its grant does not hold"
