"""The node's attempts over a real control stream: the edge link's sends and acks, the
agent handing attempts to its manager over the stream, attempts held open across an
upgrade, and the runtime offering the job activity only with a manager.

Processes run on real time, with generous bounds.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import datetime as dt
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from fixtures.attempt_grants import signed
from fixtures.attempt_processes import gone
from fixtures.fake_edges import FakeCluster, FakeNet, LongestWait, join_and_stop
from fixtures.node_attempts import (
    ATTEMPT_BOUND,
    CLUSTER_CA,
    JOB,
    NODE_ID,
    RecordingEdge,
    TrioPort,
    asyncio_run,
    grants_for,
    node_manager,
    printed_pids,
    run_attempt,
    spec,
    unsigned,
    until,
)
from oz0 import pki
from oz0_node import agent
from oz0_node.errors import EdgeUnavailable
from oz0_node.identity import IdentityDir
from oz0_node.jobs import attempt as attempt_module
from oz0_node.jobs import supervisor_client
from oz0_node.jobs.attempt import ACTIVITY, hand_over
from oz0_node.jobs.edge_link import OUTPUT_ACK, EdgeLink, LinkDown
from oz0_node.jobs.isolation import Isolation
from oz0_node.jobs.manager import AttemptManager
from oz0_node.runtime import NodeRuntime, RuntimeSettings

# What workflows from before attempts had IDs of their own schedule
# (oz0/jobs/workflow/_attempts.py).
OLD_HEARTBEAT_TIMEOUT = dt.timedelta(seconds=10)


# --- the link over the control stream ----------------------------------------------------


@dataclass
class StuckConn:
    address: str = "edge-a:7443"
    fail: bool = False

    async def send(self, kind: str, **fields: object) -> None:
        if self.fail:
            raise EdgeUnavailable("edge edge-a:7443 closed the connection")
        await trio.sleep_forever()


async def test_a_send_the_stream_does_not_take_in_time_is_link_down(
    autojump_clock: trio.testing.MockClock,
) -> None:
    link = EdgeLink()
    with pytest.raises(LinkDown, match="no control stream"):
        await link.send("job_output", {"seq": 0}, 2.0)
    link.attach(StuckConn())
    began = trio.current_time()
    with pytest.raises(LinkDown, match="did not take a job_output within 2 s"):
        await link.send("job_output", {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0
    link.attach(StuckConn(fail=True))
    with pytest.raises(LinkDown, match="closed the connection"):
        await link.send("job_output", {"seq": 0}, 2.0)
    assert trio.current_time() - began == 2.0


async def test_an_exchange_gets_the_ack_with_its_key_and_nothing_else(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    link = EdgeLink()
    ids = {"job": JOB, "attempt": 1, "seq": 0}

    @dataclass
    class Answering:
        address: str = "edge-a:7443"

        async def send(self, kind: str, **fields: object) -> None:
            link.deliver(OUTPUT_ACK, {**ids, "seq": 7, "stored": True})  # nobody's
            link.deliver(OUTPUT_ACK, {**ids, "attempt": "1", "stored": True})  # malformed
            link.deliver(OUTPUT_ACK, {**ids, "stored": False, "reason": "ended"})

    link.attach(Answering())
    ack = await link.exchange("job_output", ids, (OUTPUT_ACK, JOB, 1, 0), 5.0)
    assert ack == {**ids, "stored": False, "reason": "ended"}
    assert "malformed job_output_ack" in caplog.text
    link.attach(StuckConn())
    began = trio.current_time()
    assert await link.exchange("job_output", ids, (OUTPUT_ACK, JOB, 1, 0), 0.5) is None
    assert trio.current_time() - began == 0.5
    assert link._waiting == {}


@pytest.fixture
async def net(nursery: trio.Nursery) -> AsyncIterator[FakeNet]:
    cluster = FakeCluster()
    cluster.add_edge("edge-a:7443")
    cluster.temporal = "edge-a:7233"
    yield FakeNet(cluster, nursery)


@dataclass(eq=False)
class AttemptRuntime:
    """A runtime whose worker takes one real attempt (the real activity, in asyncio on a
    thread of its own, as the worker runs it) and hands it over to the agent's manager.

    Its activity is ACTIVITY_ID, as the workflow scheduled it (anything but `attempt-1`:
    by a workflow from before the upgrade); its heartbeats' times go to BEATS. Once
    CANCEL is set its activity is cancelled, as by its worker's stop if SHUTDOWN."""

    settings: RuntimeSettings
    raw: dict[str, Any]
    outcomes: list[object]
    activity_id: str = "attempt-1"
    beats: list[float] = field(default_factory=list)
    cancel: threading.Event | None = None
    shutdown: bool = False

    async def run(self, running: Callable[[], None]) -> None:
        running()
        if self.outcomes:  # one attempt per test, not one per stream
            await trio.sleep_forever()
        fn = NodeRuntime(self.settings)._activities()[1]
        env = ActivityEnvironment()
        env.info = dataclasses.replace(
            env.info, activity_id=self.activity_id, heartbeat_timeout=OLD_HEARTBEAT_TIMEOUT
        )
        env.on_heartbeat = lambda *_: self.beats.append(time.monotonic())

        def in_asyncio() -> object:
            async def cancel_when_told(cancel: threading.Event) -> None:
                await asyncio.to_thread(cancel.wait)
                if self.shutdown:
                    env.worker_shutdown()
                env.cancel()

            async def attempt() -> object:
                if self.cancel is None:
                    return await env.run(fn, self.raw)
                told = asyncio.ensure_future(cancel_when_told(self.cancel))
                try:
                    return await env.run(fn, self.raw)
                finally:
                    self.cancel.set()  # the waiting thread ends either way
                    await told

            try:
                return asyncio_run(attempt())
            except ApplicationError as e:
                return e
            except BaseException as e:  # raise_complete_async: handed over; cancelled
                return type(e).__name__

        self.outcomes.append(await trio.to_thread.run_sync(in_asyncio))
        await trio.sleep_forever()

    async def stop(self) -> None:
        pass


async def test_the_agent_hands_attempts_to_its_manager_which_reports_over_the_stream(
    net: FakeNet, tmp_path: Path
) -> None:
    data = tmp_path / "node"
    node_id = await join_and_stop(net, data)
    outcomes: list[object] = []

    def factory(settings: RuntimeSettings) -> AttemptRuntime:
        # Signed as the cluster signs it for this node, in its tenant.
        raw = unsigned("sh", "-c", 'echo "$OZ0_NODE_ID"; echo oops >&2; sleep 1.5')
        grant = signed(raw, net.cluster.ca, node_id=settings.node_id, tenant=settings.namespace)
        return AttemptRuntime(settings, grant, outcomes)

    def reported() -> list[dict[str, Any]]:
        return [
            e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "attempt_done"
        ]

    with trio.fail_after(ATTEMPT_BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: agent.run(
                    agent.StartOptions(data_dir=data),
                    open_stream=net.open_stream,
                    rng=LongestWait(),
                    runtime_factory=factory,
                )
            )
            await until(lambda: bool(reported()))
            nursery.cancel_scope.cancel()
    assert outcomes == ["_CompleteAsyncError"], "the activity completes asynchronously"
    [done] = reported()
    assert done["result"]["exit_code"] == 0 and done["result"]["output_complete"] is True
    sent = [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "job_output"]
    got = {(m["stream"], base64.b64decode(m["data"])) for m in sent}
    assert got == {("stdout", f"{node_id}\n".encode()), ("stderr", b"oops\n")}
    assert sorted(m["seq"] for m in sent) == list(range(len(sent)))
    alive = [
        e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == "attempt_alive"
    ]
    assert alive and alive[0]["attempts"] == [{"job": JOB, "attempt": 1}]


def from_node(net: FakeNet, kind: str) -> list[dict[str, Any]]:
    return [e.detail for e in net.cluster.of_kind("from-node") if e.detail["type"] == kind]


async def held_attempt(
    net: FakeNet, data: Path, script: str, **options: Any
) -> tuple[AttemptRuntime, str]:
    """An agent whose runtime takes one attempt of SCRIPT under a numeric activity ID, as a
    workflow from before the upgrade schedules it (OPTIONS: AttemptRuntime's), until the
    activity has returned; the runtime and the node's ID."""
    node_id = await join_and_stop(net, data)
    runtimes: list[AttemptRuntime] = []

    def factory(settings: RuntimeSettings) -> AttemptRuntime:
        raw = unsigned("sh", "-c", script)
        grant = signed(raw, net.cluster.ca, node_id=settings.node_id, tenant=settings.namespace)
        runtimes.append(AttemptRuntime(settings, grant, [], activity_id="7", **options))
        return runtimes[-1]

    with trio.fail_after(ATTEMPT_BOUND):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(
                lambda: agent.run(
                    agent.StartOptions(data_dir=data),
                    open_stream=net.open_stream,
                    rng=LongestWait(),
                    runtime_factory=factory,
                )
            )
            await until(lambda: bool(runtimes) and bool(runtimes[0].outcomes))
            # Whatever the manager would still say about it, said by now.
            await until(lambda: not supervisor_client.find_all(data))
            await trio.sleep(1.5)
            nursery.cancel_scope.cancel()
    return runtimes[0], node_id


async def test_an_attempt_scheduled_before_the_upgrade_is_held_open_and_returns_its_result(
    net: FakeNet, tmp_path: Path
) -> None:
    runtime, node_id = await held_attempt(
        net, tmp_path / "node", 'echo "$OZ0_NODE_ID"; sleep 2.5; echo done'
    )
    [result] = runtime.outcomes
    assert isinstance(result, dict), result
    assert (result["exit_code"], result["ended_because"]) == (0, "exit")
    assert result["output_complete"] is True
    # Its own heartbeats, at least every HEARTBEAT_EVERY while it ran.
    assert len(runtime.beats) >= 3
    gaps = [b - a for a, b in itertools.pairwise(runtime.beats)]
    assert max(gaps) < attempt_module.HEARTBEAT_EVERY + 0.5, gaps
    # Its output goes to the edge as any attempt's; nothing else does.
    sent = from_node(net, "job_output")
    text = b"".join(base64.b64decode(m["data"]) for m in sorted(sent, key=lambda m: m["seq"]))
    assert text == f"{node_id}\ndone\n".encode()
    assert from_node(net, "attempt_alive") == [] and from_node(net, "attempt_done") == []


@pytest.mark.parametrize("shutdown", [False, True])
async def test_a_held_attempt_cancelled_ends_its_command_first(
    net: FakeNet, tmp_path: Path, pids: list[int], shutdown: bool
) -> None:
    cancel = threading.Event()
    data = tmp_path / "node"

    async def cancel_once_running() -> None:
        await until(lambda: bool(from_node(net, "job_output")))
        cancel.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_running)
        runtime, _ = await held_attempt(
            net, data, "echo $$; exec sleep 60", cancel=cancel, shutdown=shutdown
        )
    [sent] = from_node(net, "job_output")
    pid = int(base64.b64decode(sent["data"]))
    pids.append(pid)
    assert gone(pid)
    [outcome] = runtime.outcomes
    if shutdown:
        # As before the upgrade: the runtime's stop ends it, and says so.
        assert isinstance(outcome, ApplicationError), outcome
        assert outcome.type == attempt_module.NODE_STOPPING
    else:
        assert outcome == "CancelledError"
    assert from_node(net, "attempt_alive") == [] and from_node(net, "attempt_done") == []


def test_a_new_agent_ends_a_held_attempt_it_finds_and_reports_nothing_of_it(
    tmp_path: Path, pids: list[int]
) -> None:
    first, second = RecordingEdge(), RecordingEdge()
    answers: list[dict[str, Any]] = []

    async def main() -> None:
        async with node_manager(tmp_path, first) as manager:
            # Held, as the activity hands over an attempt scheduled before the upgrade.
            await hand_over(
                spec("sh", "-c", "echo $$; exec sleep 60"),
                node_id=NODE_ID,
                port=TrioPort(manager),
                grants=grants_for(manager.data_dir),
                lost_after=10.0,
                answer=answers.append,
            )
            await until(lambda: bool(first.sent))
        (pid,) = printed_pids(first, pids)
        assert not gone(pid)
        async with node_manager(tmp_path, second) as manager:
            assert len(manager) == 1, "the new agent found the attempt"
            await until(lambda: not len(manager))
        assert gone(pid)
        await trio.sleep(1.5)  # an attempt_alive would have gone by now

    trio.run(main)
    assert first.alive == [] and second.alive == []
    assert first.done == [] and second.done == [] and answers == []


def test_logging_names_the_attempt(caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    caplog.set_level(logging.INFO, logger="oz0_node.jobs")
    run_attempt(spec("true"), RecordingEdge(), tmp_path)
    assert f"job {JOB} attempt 1: handed to its supervisor" in caplog.text


def test_the_runtime_offers_the_job_activity_only_with_an_attempt_manager(tmp_path: Path) -> None:
    identity = IdentityDir(tmp_path)
    identity.create()
    identity.save_ca(pki.cert_to_pem(CLUSTER_CA.cert))

    def names(port: Any) -> list[str]:
        settings = RuntimeSettings(
            node_id=NODE_ID,
            namespace="default",
            temporal="127.0.0.1:1",
            identity=identity,
            cluster="test",
            attempts=port,
        )
        defns = map(activity._Definition.must_from_callable, NodeRuntime(settings)._activities())
        return [str(defn.name) for defn in defns]

    assert names(TrioPort(AttemptManager(tmp_path, Isolation.detect(tmp_path)))) == [
        "oz0.node.describe",
        ACTIVITY,
    ]
    assert names(None) == ["oz0.node.describe"]
